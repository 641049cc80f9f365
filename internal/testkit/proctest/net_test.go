package proctest

import (
	"net"
	"testing"
)

// TestListen_PortZeroIsBelowTheEphemeralRange: a helper node listening on
// port 0 gets a port the kernel gives no other listener on :0 and no
// outgoing connection, so that its restart on the same port finds it free
// (CI saw a restarted node's port taken by another test's node).
func TestListen_PortZeroIsBelowTheEphemeralRange(t *testing.T) {
	lo, hi := stableRange()
	if hi <= lo {
		t.Skip("no room below this kernel's ephemeral range")
	}
	for range 20 {
		l, err := Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port < lo || port >= hi {
			t.Fatalf("Listen(127.0.0.1:0) listened on %d, want [%d, %d): below the ephemeral range", port, lo, hi)
		}
	}
}
