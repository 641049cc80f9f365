package faulttest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

// binDir holds the programs the scenarios run, built once per test binary.
var (
	binDir  string
	binOnce = map[string]*sync.Once{}
	binMu   sync.Mutex
	binErrs = map[string]error{}
)

func TestMain(m *testing.M) {
	if helperMain() { // this binary, re-executed as a scenario's helper
		return
	}
	dir, err := os.MkdirTemp("", "tensorwire-faulttest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// skipShort skips a scenario under "go test -short": the fault suite is
// not part of the quick loop (its unit tests, of the judge, still run).
func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("the fault suite does not run under -short")
	}
}

// program returns the path of the repository's program at pkg (a path
// relative to the module root, "./cmd/tensorwire"), built on first use with
// the go command that runs this test.
func program(t testing.TB, pkg string) string {
	t.Helper()
	proctest.DependOnModule(t) // the program is not in this test's binary
	binMu.Lock()
	once, ok := binOnce[pkg]
	if !ok {
		once = new(sync.Once)
		binOnce[pkg] = once
	}
	binMu.Unlock()
	out := filepath.Join(binDir, filepath.Base(pkg))
	once.Do(func() {
		cmd := exec.Command(goTool(), "build", "-o", out, pkg)
		cmd.Dir = ".." // the module root
		if b, err := cmd.CombinedOutput(); err != nil {
			binMu.Lock()
			binErrs[pkg] = fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
			binMu.Unlock()
		}
	})
	binMu.Lock()
	err := binErrs[pkg]
	binMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// goTool returns the go command: the one in GOROOT/bin if the toolchain
// that runs the test put it there, else the one on PATH.
func goTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
