package proctest

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// HelperExit is the status a helper run by RunHelper exits with when its
// role returns: a helper serves or holds until its test kills it, so one
// that returns, with an error or without, has failed.
const HelperExit = 3

// AddrPrefix begins the line Serve prints with the address it listens on;
// StartServer waits for it.
const AddrPrefix = "ADDR"

// RunHelper is the body of a package's TestHelperProcess, the test that
// Start runs in the child. The environment variable env names the child's
// role: with env unset or empty RunHelper skips t (the test binary run
// normally runs TestHelperProcess too, and it is not a test); otherwise it
// runs roles[role], writes "helper: " and what it returned to stderr and
// exits with status HelperExit. A role not in roles is a test's mistake:
// it is reported the same way. A role tells its test what it is doing by
// printing lines for Expect, and fails by returning an error. A role may
// use t for the package's fixtures; one that fails it (t.Fatal) ends the
// child as a failed test ends, with status 1 and the message on stdout,
// which its test sees as an early exit.
func RunHelper(t *testing.T, env string, roles map[string]func() error) {
	role := os.Getenv(env)
	if role == "" {
		t.Skip("the body of a helper process")
	}
	err := fmt.Errorf("%s=%q: no such role", env, role)
	if fn, ok := roles[role]; ok {
		err = fn()
	}
	fmt.Fprintln(os.Stderr, "helper:", err)
	os.Exit(HelperExit)
}

// Serve is how a helper that is a server starts: it listens on addr with
// Listen (any loopback port if addr is ""), prints AddrPrefix and the
// address it listens on ("ADDR 127.0.0.1:41234") for StartServer, and
// returns serve(l), which serves until the process is killed. A node
// restarted by its test is given its old address: Listen retries while
// the killed one's port is still taken.
func Serve(addr string, serve func(net.Listener) error) error {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := Listen(addr)
	if err != nil {
		return err
	}
	fmt.Println(AddrPrefix, l.Addr())
	return serve(l)
}

// StartServer starts a helper as Start does, waits (as Expect does) for
// the address it printed with Serve, and returns the process and that
// address.
func StartServer(t testing.TB, env ...string) (*Proc, string) {
	t.Helper()
	p := Start(t, env...)
	return p, p.Expect(t, AddrPrefix)
}
