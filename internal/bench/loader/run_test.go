package loader

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
)

// testSelf are the arguments with which Run re-executes the test binary
// for a child (bench.Env.Self), as cmd/tensorwire does.
var testSelf = []string{"bench", "loader"}

func testEnv(stdout, stderr io.Writer) bench.Env {
	return bench.Env{Stdout: stdout, Stderr: stderr, Self: testSelf}
}

// TestMain lets Run re-execute the test binary for a child: "bench loader
// ARGS" runs Run(ARGS), as cmd/tensorwire does.
func TestMain(m *testing.M) { benchtest.Main(m, Run, testSelf...) }

// runKeys are the keys of each run in --json's "runs", as issue 16 names
// them; docs/benchmarks.md lists the others.
var runKeys = []string{"dataset", "consumers", "mode", "samples_per_s_per_consumer", "cpu_s", "net_bytes_per_batch", "exactly_once"}

// TestRun_Small runs both workloads small (200 synthetic samples, the
// stand-in for Fashion-MNIST), shared and independent, and the mixed
// batch sizes, every process at GOMAXPROCS 1 (--procs; the run fails if a
// consumer reports another), and checks the table, the JSON keys and that
// every consumer saw every sample exactly once.
func TestRun_Small(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.json")
	run := benchtest.RunJSON(t, Run, testSelf, []string{
		"--samples", "200", "--consumers", "1,3", "--step", "0", "--slots", "4", "--procs", "1",
		"--fashion", filepath.Join(dir, "none"), "--dir", dir, "--json", out,
	}, out)
	for _, want := range []string{"samples/s/consumer", "exactly once", "goal (a), 3 consumers", "mixed batch sizes [32 64 128]", "GOMAXPROCS 1 in every process"} {
		if !strings.Contains(run.Stdout, want) {
			t.Errorf("the output lacks %q:\n%s", want, run.Stdout)
		}
	}
	b := run.Data
	var res struct {
		Procs int              `json:"procs"`
		Runs  []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Procs != 1 {
		t.Errorf("procs %d in the JSON, want 1", res.Procs)
	}
	// synthetic 1 and 3, shared and independent, mixed; fashion-mnist the same less mixed.
	if len(res.Runs) != 9 {
		t.Fatalf("%d runs, want 9:\n%s", len(res.Runs), b)
	}
	for _, r := range res.Runs {
		for _, k := range runKeys {
			if _, ok := r[k]; !ok {
				t.Errorf("a run lacks %q: %v", k, r)
			}
		}
		if r["exactly_once"] != true {
			t.Errorf("not exactly once: %v", r)
		}
		if m := r["mode"]; m != "shared" && m != "independent" {
			t.Errorf("mode %v", m)
		}
		if d := r["dataset"]; d != "synthetic" && d != "fashion-mnist" {
			t.Errorf("dataset %v", d)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the run left %d entries in its --dir, want only the JSON file", len(entries))
	}
}

func TestRun_Usage(t *testing.T) {
	for _, args := range [][]string{
		{"--dataset", "imagenet"},
		{"--consumers", "0"},
		{"--consumers", "two"},
		{"--batch", "0"},
		{"--batch", "100", "--slots", "1", "--producer-batch", "64"},
		{"--step", "-1s"},
		{"--procs", "-1"},
		{"--procs", "1", "--producer", "python"},
		{"--device", "cuda:0"}, // without --producer python
		{"--source", "premade"},
		{"--tensorsocket", "on"},
		{"--producer", "python", "--source", "imagenet"},
		{"--producer", "python", "--tensorsocket", "yes"},
		{"extra"},
	} {
		err := Run(context.Background(), testEnv(io.Discard, io.Discard), args)
		if !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	if err := Run(context.Background(), testEnv(io.Discard, io.Discard), []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}
