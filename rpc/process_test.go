package rpc

// Tests with the peer in another process, killed with SIGKILL while a call
// is in flight. The other process is this test binary run again with
// -test.run=^TestHelperProcess$ and TENSORWIRE_TEST_HELPER saying what to
// be: a node ("node") or a caller ("caller").

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/proctest"
)

// Environment of a helper process.
const (
	envHelper = "TENSORWIRE_TEST_HELPER" // "node" or "caller"
	envAddr   = "TENSORWIRE_TEST_ADDR"   // node: where to listen; caller: whom to call
	envRoot   = "TENSORWIRE_TEST_ROOT"   // node: its root, if any
)

// methodSlow is the helper node's method that blocks until its caller goes
// away; it prints "SLOW" when it starts.
const methodSlow = "test.slow"

// TestHelperProcess is not a test: it is the body of the helper processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(envHelper) {
	case "node":
		helperNode()
	case "caller":
		helperCaller()
	default:
		t.Skip("the body of a helper process")
	}
}

// helperNode serves test.echo and test.slow on $TENSORWIRE_TEST_ADDR (or a
// free port), prints "ADDR host:port", and serves until killed.
func helperNode() {
	var opts []Option
	if root := os.Getenv(envRoot); root != "" {
		opts = append(opts, WithRoot(root))
	}
	s, err := NewServer(opts...)
	if err != nil {
		helperFail(err)
	}
	Register(s, methodEcho, func(ctx context.Context, m echoMsg) (echoMsg, error) { return m, nil })
	Register(s, methodSlow, func(ctx context.Context, m echoMsg) (echoMsg, error) {
		fmt.Println("SLOW")
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
		}
		return m, ctx.Err()
	})
	addr := os.Getenv(envAddr)
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := proctest.Listen(addr)
	if err != nil {
		helperFail(err)
	}
	fmt.Println("ADDR", l.Addr())
	helperFail(s.Serve(l))
}

// helperCaller dials $TENSORWIRE_TEST_ADDR, prints "CALLING" and calls
// test.block, which does not return until the caller is killed.
func helperCaller() {
	c, err := Dial(context.Background(), os.Getenv(envAddr))
	if err != nil {
		helperFail(err)
	}
	fmt.Println("CALLING")
	_, err = Call[echoMsg](context.Background(), c, methodBlock, echoMsg{})
	helperFail(fmt.Errorf("test.block returned: %v", err))
}

func helperFail(err error) {
	fmt.Fprintln(os.Stderr, "helper:", err)
	os.Exit(3)
}

// startHelper runs the helper process as role with env added
// (internal/proctest).
func startHelper(t *testing.T, role string, env ...string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, append([]string{envHelper + "=" + role}, env...)...)
}

// TestClient_NodeKilled kills the node while a call is in flight: the call
// fails with Unavailable when the socket closes (no watchdog to time out),
// and once a node listens on the same address again the same Client
// reaches it.
func TestClient_NodeKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	node := startHelper(t, "node", envRoot+"="+t.TempDir())
	addr := node.Expect(t, "ADDR")
	// No watchdog: only the socket's close can end the call in flight,
	// however long the kill takes to be seen on a busy machine.
	c := dial(t, addr, WithKeepAlive(-1))
	echo(t, c)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	call := Go[echoMsg](ctx, c, methodSlow, echoMsg{})
	node.Expect(t, "SLOW")
	killed := node.Kill()
	select {
	case <-call.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the call in flight did not end within 30 s of the kill")
	}
	took := time.Since(killed)
	if _, err := call.Wait(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the call in flight: %v, want Unavailable", err)
	}
	t.Logf("the call in flight failed %v after the kill", took)

	// While the node is down, calls fail at once with Unavailable.
	start := time.Now()
	if _, err := Call[echoMsg](ctx, c, methodEcho, echoMsg{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a call with the node down: %v, want Unavailable", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("a call with the node down took %v", took)
	}

	// A new node on the same address: the same Client dials it again.
	node = startHelper(t, "node", envAddr+"="+addr)
	if got := node.Expect(t, "ADDR"); got != addr {
		t.Fatalf("the new node listens on %s, want %s", got, addr)
	}
	echo(t, c)
	call = Go[echoMsg](ctx, c, methodSlow, echoMsg{})
	node.Expect(t, "SLOW")
	node.Kill()
	if _, err := call.Wait(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the call in flight on the second node: %v, want Unavailable", err)
	}
}

// TestServer_CallerKilled kills a caller while its call runs: the handler's
// context ends when the socket closes (the server sends no pings to time
// out), and the node serves others.
func TestServer_CallerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := startTestNode(t, WithKeepAlive(-1)) // no pings: only the socket's close can end the call
	caller := startHelper(t, "caller", envAddr+"="+n.addr)
	caller.Expect(t, "CALLING")
	select {
	case <-n.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the caller's call did not start")
	}
	killed := caller.Kill()
	select {
	case err := <-n.ended:
		if err == nil {
			t.Fatal("the handler returned without its context ending")
		}
		took := time.Since(killed)
		t.Logf("the handler's context ended %v after the kill", took)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context did not end within 30 s of the kill")
	}
	echo(t, dial(t, n.addr))
}
