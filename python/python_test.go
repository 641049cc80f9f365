package python

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
// the Python client with.
func TestPython_Suite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command and runs nodes")
	}
	py := pythonWithDeps(t)
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
	cmd := exec.Command(py, "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Env = append(os.Environ(), "TENSORWIRE_BIN="+bin, "TENSORWIRE_GOCLIENT="+goclient, "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=.")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		t.Fatalf("the Python suite failed: %v\n%s", err, out.String())
	}
	// unittest ends with "OK" or "OK (skipped=N)"; say which were skipped.
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "skipped") {
			t.Log(line)
		}
	}
	t.Logf("%s", lastLines(out.String(), 3))
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
