package proctest

import (
	"errors"
	"io"
	"net"
	"os/exec"
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
	})
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
