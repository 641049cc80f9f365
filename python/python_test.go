package python

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

// pythonWithDeps returns the interpreter the suite runs with:
// $TENSORWIRE_PYTHON when set (CI sets it to its venv's, with PyPI's torch
// and tensordict; there a missing numpy or msgpack fails the test rather
// than skipping it), else the first of /usr/bin/python3 and python3 that
// imports numpy and msgpack (Debian's python3-numpy and python3-msgpack
// install them for /usr/bin/python3, which may not be the python3 first on
// PATH), or skips t saying so.
func pythonWithDeps(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TENSORWIRE_PYTHON"); p != "" {
		if out, err := exec.Command(p, "-c", "import numpy, msgpack").CombinedOutput(); err != nil {
			t.Fatalf("TENSORWIRE_PYTHON=%s cannot import numpy and msgpack: %v\n%s", p, err, out)
		}
		return p
	}
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import numpy, msgpack").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with numpy and msgpack (apt-get install python3-numpy python3-msgpack): the Python client's tests not run")
	return ""
}

// TestPython_Suite runs the Python client's test suite (python/tests, the
// standard library's unittest) against real Go nodes: the command built
// from this tree, started as `tensorwire node` processes by the suite, and
// the Go serve client of tests/goclient, which the serve tests compare
// the Python client with. Its modules run in suiteProcs unittest processes
// at once (suiteShards); a module runs alone as
// `cd python/tests && PYTHONPATH=.. python3 -m unittest -v test_NAME`.
func TestPython_Suite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command and runs nodes")
	}
	py := pythonWithDeps(t)
	// The suite runs a tensorwire built here from the module's Go and
	// tests/*.py: neither is in this test's binary.
	proctest.DependOnModule(t)
	if out, err := exec.Command(py, "-c", "import sys; print(sys.executable, sys.version.split()[0])").Output(); err == nil {
		t.Logf("Python: %s", strings.TrimSpace(string(out)))
	}
	bin := filepath.Join(t.TempDir(), "tensorwire")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tensorwire")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/tensorwire: %v\n%s", err, out)
	}
	goclient := filepath.Join(t.TempDir(), "goclient")
	build = exec.Command("go", "build", "-o", goclient, "./python/tests/goclient")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./python/tests/goclient: %v\n%s", err, out)
	}
	shards, err := suiteShards(suiteProcs)
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]bytes.Buffer, len(shards))
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, mods := range shards {
		wg.Go(func() {
			cmd := exec.Command(py, append([]string{"-m", "unittest", "-v"}, mods...)...)
			cmd.Dir = "tests"
			cmd.Env = append(os.Environ(), "TENSORWIRE_BIN="+bin, "TENSORWIRE_GOCLIENT="+goclient, "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=..")
			cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
			errs[i] = cmd.Run()
		})
	}
	wg.Wait()
	for i, mods := range shards {
		out := outs[i].String()
		if errs[i] != nil {
			// The failures' tracebacks first: a log cut in its middle
			// (CI's summaries keep a head and a tail) still shows them.
			t.Errorf("the Python suite's shard %d (%s) failed: %v\n%s\n--- the shard's whole output:\n%s",
				i, strings.Join(mods, " "), errs[i], failures(out), out)
			continue
		}
		// unittest ends with "OK" or "OK (skipped=N)"; say which were skipped.
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "skipped") {
				t.Log(line)
			}
		}
		t.Logf("shard %d (%s):\n%s", i, strings.Join(mods, " "), lastLines(out, 3))
	}
}

// suiteProcs is how many unittest processes run the suite at once, each
// its share of the modules (suiteShards). Much of a module's time is its
// nodes and rank processes waiting on each other and on the kernel: on
// CI's two cores two at once took 91 s here (2026-11-29) against about 130
// s of the modules' tests one after another, test_collective (57 s) alone
// in one of them.
const suiteProcs = 2

// suiteWeights are the seconds the slowest modules' tests took in one
// process with CI's venv (PyPI's torch, the slower of CI's two runs of the
// suite; 2026-11-30, the 2-core machine); every other took about 2 or
// less. Dealt by them, the two shards took 176 and 176 s of the modules'
// times there, against 159 and 193 with the weights of Debian's torch.
// test_collective's is 2026-12-02's, alone on the machine, once its ranks
// were forked from a zygote (tests/zygote.py): 116 s before, 73 after.
var suiteWeights = map[string]float64{
	"test_collective": 73, "test_examples": 49, "test_producer_device": 31, "test_replica_readme": 18,
	"test_replica": 16, "test_producer": 16, "test_pip": 16, "test_serve": 10, "test_readme": 9,
	"test_replay": 8, "test_tensordict_interop": 7, "test_replay_seq_slices": 7, "test_loader": 6,
	"test_replay_seq_dataset": 5, "test_rpc": 5, "test_replica_weights": 4, "test_replica_node": 4,
	"test_replica_window": 4, "test_outpool": 4, "test_golden_services": 3, "test_store": 3,
}

// suiteShards deals the modules of tests/test_*.py into n shards of about
// equal weight (the heaviest first, each to the lightest shard so far).
func suiteShards(n int) ([][]string, error) {
	files, err := filepath.Glob("tests/test_*.py")
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no tests/test_*.py: %v", err)
	}
	mods := make([]string, len(files))
	for i, f := range files {
		mods[i] = strings.TrimSuffix(filepath.Base(f), ".py")
	}
	weight := func(m string) float64 {
		if w, ok := suiteWeights[m]; ok {
			return w
		}
		return 2
	}
	sort.SliceStable(mods, func(i, j int) bool { return weight(mods[i]) > weight(mods[j]) })
	shards := make([][]string, n)
	load := make([]float64, n)
	for _, m := range mods {
		k := 0
		for i := range load {
			if load[i] < load[k] {
				k = i
			}
		}
		shards[k] = append(shards[k], m)
		load[k] += weight(m)
	}
	return shards, nil
}

// failures returns unittest's report of its failures and errors: from its
// first "=====" line (each failed test's traceback under one) to the end,
// or the last 40 lines when there is none (a crash before the report).
func failures(out string) string {
	if i := strings.Index(out, "\n======"); i >= 0 {
		return out[i+1:]
	}
	return lastLines(out, 40)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestExtract_WritesThePackage checks that Extract writes every file of
// the package as it is in this folder.
func TestExtract_WritesThePackage(t *testing.T) {
	dir := t.TempDir()
	if err := Extract(dir); err != nil {
		t.Fatal(err)
	}
	want, err := filepath.Glob("tensorwire/*.py")
	if err != nil || len(want) < 5 {
		t.Fatalf("glob: %v, %v", want, err)
	}
	for _, p := range want {
		a, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: extracted copy differs (%v)", p, err)
		}
	}
}

// TestFailures checks that a failed shard's report leads with unittest's
// tracebacks, and falls back to the output's end without them.
func TestFailures(t *testing.T) {
	verbose := "test_a (m.T.test_a) ... ok\ntest_b (m.T.test_b) ... FAIL\n"
	report := "======================================================================\nFAIL: test_b (m.T.test_b)\n" +
		"AssertionError: 1 != 2\n\nFAILED (failures=1)\n"
	long := strings.Repeat("line\n", 50) + "Segmentation fault\n"
	for _, tc := range []struct{ name, out, want string }{
		{"report", verbose + "\n" + report, report},
		{"no report", long, lastLines(long, 40)},
	} {
		if got := failures(tc.out); got != tc.want {
			t.Errorf("%s: failures() = %q, want %q", tc.name, got, tc.want)
		}
	}
}
