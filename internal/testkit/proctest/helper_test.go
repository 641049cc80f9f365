package proctest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const envRole = "TENSORWIRE_PROCTEST_ROLE"

// TestHelperProcess is not a test: it is the body of the helper processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	RunHelper(t, envRole, map[string]func() error{
		// serve answers "hi" to each connection, until killed.
		"serve": func() error {
			return Serve("", func(l net.Listener) error {
				for {
					c, err := l.Accept()
					if err != nil {
						return err
					}
					c.Write([]byte("hi"))
					c.Close()
				}
			})
		},
		"fail": func() error { return errors.New("boom") },
		// block waits for ever in blockForDump.
		"block": func() error {
			blockForDump()
			return nil
		},
	})
}

// blockForDump says it is ready, from inside it (so that its frame is on
// the stack from the moment the line is out), and waits for ever: TestDump
// looks for its name in the stacks.
func blockForDump() {
	fmt.Println("ready")
	select {}
}

// TestDump: a helper that waits for ever writes the stack of the goroutine
// that waits, by name, and exits when asked for its stacks; Dump returns
// once it is gone.
func TestDump(t *testing.T) {
	p := Start(t, envRole+"=block")
	p.Expect(t, "ready")
	stderr := p.Dump(30 * time.Second)
	if !strings.Contains(stderr, "proctest.blockForDump") || !strings.Contains(stderr, "goroutine ") {
		t.Errorf("stderr %q, want the stack of blockForDump", tail(stderr, 2000))
	}
	if p.Alive() {
		t.Fatal("alive after Dump")
	}
	if ee, ok := errors.AsType[*exec.ExitError](p.ExitErr()); !ok || ee.ExitCode() != 2 {
		t.Errorf("exit %v, want status 2 (the runtime's, on SIGQUIT): it was not asked for its stacks", p.ExitErr())
	}
}

// TestStartServer_Serves: a helper that serves is reachable at the address
// StartServer returns.
func TestStartServer_Serves(t *testing.T) {
	p, addr := StartServer(t, envRole+"=serve")
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if b, err := io.ReadAll(c); err != nil || string(b) != "hi" {
		t.Fatalf("read %q, %v; want hi", b, err)
	}
	p.Kill()
}

// TestRunHelper_Exits: a role that returns, and a role that is not one,
// end the helper with status HelperExit and say why on stderr.
func TestRunHelper_Exits(t *testing.T) {
	for _, tc := range []struct{ role, want string }{
		{"fail", "helper: boom"},
		{"no-such", envRole + `="no-such": no such role`},
	} {
		t.Run(tc.role, func(t *testing.T) {
			p := Start(t, envRole+"="+tc.role)
			err := p.WaitFor(30 * time.Second)
			if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != HelperExit {
				t.Errorf("exit %v, want status %d", err, HelperExit)
			}
			if !strings.Contains(p.Stderr(), tc.want) {
				t.Errorf("stderr %q, want it to say %q", p.Stderr(), tc.want)
			}
		})
	}
}

// TestDependOnModule_ChangeRunsAgain: in a scratch module whose test calls
// DependOnModule, a second go test is answered from the cache, and a
// change to a file no test binary holds (as a Python test module is) makes
// the third run the test again. Without DependOnModule the third is
// "(cached)" too.
func TestDependOnModule_ChangeRunsAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	root := DependOnModule(t)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module github.com/tensorwire/tensorwire/scratch\n\ngo 1.24\n\nrequire github.com/tensorwire/tensorwire v0.0.0\n\nreplace github.com/tensorwire/tensorwire => " + root + "\n",
		"go.sum": string(sum),
		"scratch_test.go": `package scratch

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

func TestScratch(t *testing.T) { proctest.DependOnModule(t) }
`,
		"data/script.py": "print(1)\n",
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func() string {
		t.Helper()
		cmd := exec.Command("go", "test", ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go test in the scratch module: %v\n%s", err, out)
		}
		return string(out)
	}
	// go test does not cache a run whose inputs changed in the last
	// seconds: the files are made old.
	old := time.Now().Add(-time.Hour)
	age := func() {
		filepath.WalkDir(dir, func(p string, _ os.DirEntry, _ error) error { return os.Chtimes(p, old, old) })
	}
	age()
	run()
	if out := run(); !strings.Contains(out, "(cached)") {
		t.Fatalf("the second run was not answered from the cache: %s", out)
	}
	if err := os.WriteFile(filepath.Join(dir, "data", "script.py"), []byte("print(2)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Only the script's time and size change, as an edit's would (an
	// hour ago, so the run may be cached).
	if err := os.Chtimes(filepath.Join(dir, "data", "script.py"), old.Add(time.Minute), old.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if out := run(); strings.Contains(out, "(cached)") {
		t.Fatalf("a changed file outside the test binary left the cached result: %s", out)
	}
}
