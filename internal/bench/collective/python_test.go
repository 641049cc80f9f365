package collective

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

// The flags of --lang python: what it cannot run is a usage error, before
// any process starts.
func TestPython_Usage(t *testing.T) {
	env := bench.Env{Stdout: io.Discard, Stderr: io.Discard}
	for _, args := range [][]string{
		{"--lang", "ruby"},
		{"--lang", "python", "--ops", "broadcast"},
		{"--lang", "python", "--systems", "nccl"},
		{"--lang", "python", "--hosts", "netns", "--transports", "tcp"},
		{"--lang", "python", "--python", "/nonexistent/python3"},
	} {
		if err := Run(context.Background(), env, args); !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

// TestRun_Python runs --lang python at its smallest: two Python ranks
// with their sidecars (the tensorwire binary, built here) and gloo's, one
// size, beside Go's. It skips where no python3 has numpy, msgpack and
// torch.
func TestRun_Python(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	py := ""
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(c, "-c", "import numpy, msgpack, torch").Run() == nil {
			py = c
			break
		}
	}
	if py == "" {
		t.Skip("no python3 with numpy, msgpack and torch")
	}
	proctest.DependOnModule(t) // the binary built below is not in this test's
	bin := filepath.Join(t.TempDir(), "tensorwire")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tensorwire")
	build.Dir = "../../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	res, out := runJSON(t, "--lang", "python", "--python", py, "--tensorwire", bin, "--ranks", "2", "--sizes", "1KB",
		"--transports", "shm", "--systems", "tensorwire,gloo,mpi4torch")
	systems := map[string]int{}
	for _, r := range res.Runs {
		if r.P50us <= 0 || r.Ranks != 2 || r.Bytes != 1024 {
			t.Fatalf("run %+v", r)
		}
		systems[r.System]++
	}
	// go and tensorwire on shm, gloo on tcp: forward and forward+backward each.
	if systems["go"] != 2 || systems["tensorwire"] != 2 || systems["gloo"] != 2 {
		t.Fatalf("runs by system %v:\n%s", systems, out)
	}
	if !strings.Contains(out, "python - go") || !strings.Contains(out, "mpi4torch") {
		t.Fatalf("the table lacks the overhead column or mpi4torch's line:\n%s", out)
	}
}
