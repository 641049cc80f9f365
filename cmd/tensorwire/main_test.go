package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fixtures is the tensordict package's golden data, written as tensordict
// writes it.
const fixtures = "../../tensordict/testdata/golden"

// binDir holds the command built once for the tests that run it as a
// process (cliBinary); TestMain removes it.
var (
	binDir   string
	binOnce  sync.Once
	binPath  string
	binError error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// cliBinary builds the command (once per test run) and returns its path.
func cliBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binError = os.MkdirTemp("", "tensorwire-test-"); binError != nil {
			return
		}
		binPath = filepath.Join(binDir, "tensorwire")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binError = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binError != nil {
		t.Fatal(binError)
	}
	return binPath
}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestInspect_JSON(t *testing.T) {
	code, out, errOut := runCLI(t, "inspect", filepath.Join(fixtures, "basic_orjson"), "--json", "--stats")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		BatchSize []int `json:"batch_size"`
		Fields    map[string]struct {
			DType         string
			Shape         []int
			Bytes         int64
			Sum, Min, Max *float64
		} `json:"fields"`
		NonTensor map[string]any `json:"nontensor"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	obs, ok := rep.Fields["obs"]
	if !ok || obs.DType != "torch.float32" || obs.Bytes != 48 || *obs.Sum != 66 || *obs.Min != 0 || *obs.Max != 11 {
		t.Errorf("obs = %+v", obs)
	}
	if r := rep.Fields["next/reward"]; r.Sum == nil || *r.Sum != 8 {
		t.Errorf("next/reward = %+v, want sum 8", r)
	}
	if d := rep.Fields["done"]; *d.Sum != 2 {
		t.Errorf("done sum %v, want 2 (two true)", *d.Sum)
	}

	code, out, _ = runCLI(t, "inspect", "--json", filepath.Join(fixtures, "empty_leaf"))
	if code != 0 || strings.Contains(out, "sum") {
		t.Errorf("without --stats there are no stats: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "inspect", "--json", "--stats", filepath.Join(fixtures, "empty_leaf"))
	if code != 0 {
		t.Fatal(out)
	}
	json.Unmarshal([]byte(out), &rep)
	if e := rep.Fields["e"]; e.Sum != nil || e.Bytes != 0 {
		t.Errorf("a leaf with no elements has stats or bytes: %+v", e)
	}
}

func TestInspect_Tree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nt")
	os.CopyFS(dir, os.DirFS(filepath.Join(fixtures, "escaped_keys")))
	code, out, errOut := runCLI(t, "inspect", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"batch_size=[2]", "├── a/b ", "torch.int32", "└── sub dir", "TensorDict"} {
		if !strings.Contains(out, want) {
			t.Errorf("tree lacks %q:\n%s", want, out)
		}
	}
}

func TestRun_Errors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no command", nil, 2, ""},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"inspect without prefix", []string{"inspect"}, 2, "want one PREFIX"},
		{"inspect bad flag", []string{"inspect", "--nope", "x"}, 2, "nope"},
		{"inspect missing prefix", []string{"inspect", "/nonexistent/prefix"}, 1, "/nonexistent/prefix/meta.json"},
		{"inspect pickle", []string{"inspect", filepath.Join(fixtures, "nontensor")}, 1, "other.pickle"},
		{"import unknown format", []string{"import", "csv", "x"}, 2, "idx or npy"},
		{"import idx unpaired", []string{"import", "idx", "--images", "a", "p"}, 2, "pairs"},
		{"import npy bad arg", []string{"import", "npy", "nokey", "p"}, 2, "key=FILE.npy"},
		{"node without root", []string{"node", "--listen", "127.0.0.1:0"}, 2, "missing --root"},
		{"node without listen", []string{"node", "--root", t.TempDir()}, 2, "missing --listen"},
		{"node tls cert alone", []string{"node", "--listen", "127.0.0.1:0", "--root", t.TempDir(), "--tls-cert", "c.pem"}, 2, "together"},
		{"node empty token", []string{"node", "--listen", "127.0.0.1:0", "--root", t.TempDir(), "--token-file", tokenFile(t, "\n", 0o600)}, 1, "is empty"},
		{"node world-readable token", []string{"node", "--listen", "127.0.0.1:0", "--root", t.TempDir(), "--token-file", tokenFile(t, "s3cret", 0o644)}, 1, "other users"},
		{"node missing root", []string{"node", "--listen", "127.0.0.1:0", "--root", "/nonexistent/root"}, 1, "/nonexistent/root"},
		{"import idx missing file", []string{"import", "idx", "--images", "/nonexistent/i", "--labels", "/nonexistent/l", filepath.Join(t.TempDir(), "p")}, 1, "/nonexistent/i"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.msg) {
				t.Errorf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut, tc.code, tc.msg)
			}
		})
	}
}

// TestBinary_ImportThenInspect runs the built command as a user would, on
// the real Fashion-MNIST files when the Debian package is installed.
func TestBinary_ImportThenInspect(t *testing.T) {
	const dir = "/usr/share/datasets/fashion-mnist"
	if _, err := os.Stat(filepath.Join(dir, "t10k-images-idx3-ubyte.gz")); err != nil {
		t.Skipf("Debian package dataset-fashion-mnist is not installed (.ci/run installs it): %v", err)
	}
	bin := cliBinary(t)
	prefix := filepath.Join(t.TempDir(), "fmnist")
	imp := exec.Command(bin, "import", "idx",
		"--images", filepath.Join(dir, "t10k-images-idx3-ubyte.gz"), "--labels", filepath.Join(dir, "t10k-labels-idx1-ubyte.gz"), prefix)
	if out, err := imp.CombinedOutput(); err != nil || !strings.Contains(string(out), "100%") {
		t.Fatalf("import: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "inspect", "--json", "--stats", prefix).Output()
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		BatchSize []int `json:"batch_size"`
		Fields    map[string]struct{ Sum float64 }
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.BatchSize) != 1 || rep.BatchSize[0] != 10000 || rep.Fields["labels"].Sum != 45000 {
		t.Errorf("inspect after import: %s", out)
	}
	if err := exec.Command(bin, "import", "idx", "--images", filepath.Join(dir, "t10k-images-idx3-ubyte.gz"),
		"--labels", filepath.Join(dir, "t10k-labels-idx1-ubyte.gz"), prefix).Run(); err == nil {
		t.Error("importing onto an existing prefix without --force succeeded")
	}
}
