package serve

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// A replica's window (replicaRequest.Window): the node keeps that many of
// its batches in flight, each answered in order, and when the replica goes
// away every batch it held runs on another replica.

// lanes counts the manager's replicas (an attached replica's lanes each
// count).
func lanes(m *Manager) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.replicas)
}

// gotWithin is the rows of the next batch r receives, failing t when none
// comes within a generous hang guard.
func gotWithin(t *testing.T, r *goReplica, what string) int {
	t.Helper()
	select {
	case n := <-r.got:
		return n
	case <-time.After(30 * time.Second):
		t.Fatalf("the replica did not get %s", what)
		return 0
	}
}

// windowOf2 serves a model of attached replicas only, attaches one of
// window 2 whose stream the test answers on (or not), and dials a client.
func windowOf2(t *testing.T) (*node, *rpc.Stream[replicaAnswer, replicaBatch], *Client) {
	t.Helper()
	n := serveModel(t, "", attachedConfig(8))
	st := openReplica(ctxT(t), t, n.addr, 2)
	waitAttached(t, n.m, 1)
	return n, st, dial(t, n.addr, "", "bytes")
}

func TestWindow_Lanes(t *testing.T) {
	for _, c := range []struct{ window, lanes int }{{0, 1}, {1, 1}, {2, 2}, {99, maxWindow}} {
		n := serveModel(t, "", attachedConfig(8))
		attachReplicaWindow(t, n.addr, 1, c.window, nil)
		waitAttached(t, n.m, 1) // a replica, however many lanes
		if got := lanes(n.m); got != c.lanes {
			t.Errorf("window %d: %d lanes, want %d", c.window, got, c.lanes)
		}
	}
}

// TestWindow_TwoInFlight: a replica of window 2 reads two batches before
// it answers either (with a window of 1 the second would wait for the
// first's answer: the test would hang), then answers both in order.
func TestWindow_TwoInFlight(t *testing.T) {
	_, st, c := windowOf2(t)
	call1 := c.Go(ctxT(t), rowsOf(t, 5, 3))
	b1, err := st.Recv(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	call2 := c.Go(ctxT(t), rowsOf(t, 2, 7))
	b2, err := st.Recv(ctxT(t)) // before answering the first
	if err != nil {
		t.Fatal(err)
	}
	if b1.N != 3 || b2.N != 7 || b2.Batch != b1.Batch+1 {
		t.Fatalf("batches %d (%d rows) and %d (%d rows), want 3 rows then 7", b1.Batch, b1.N, b2.Batch, b2.N)
	}
	model := &testModel{b: &behaviour{}}
	for _, b := range []replicaBatch{b1, b2} {
		out, err := model.Forward(ctxT(t), b.In.TensorDict)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(ctxT(t), replicaAnswer{Batch: b.Batch, Version: 3, Out: &rpc.TD{TensorDict: out}}); err != nil {
			t.Fatal(err)
		}
	}
	wantAnswer(t, "call 1", call1, 5, 3, 3)
	wantAnswer(t, "call 2", call2, 2, 7, 3)
}

// TestWindow_OutOfOrder: an answer to the second batch before the first
// ends the stream, and both batches fail: the replica broke the protocol.
func TestWindow_OutOfOrder(t *testing.T) {
	n, st, c := windowOf2(t)
	call1 := c.Go(ctxT(t), rowsOf(t, 5, 3))
	if _, err := st.Recv(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	call2 := c.Go(ctxT(t), rowsOf(t, 2, 7))
	b2, err := st.Recv(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	out, err := (&testModel{b: &behaviour{}}).Forward(ctxT(t), b2.In.TensorDict)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(ctxT(t), replicaAnswer{Batch: b2.Batch, Out: &rpc.TD{TensorDict: out}}); err != nil {
		t.Fatal(err)
	}
	for i, call := range []*Call{call1, call2} {
		if _, _, err := call.Wait(); !errors.Is(err, ErrForward) || !strings.Contains(err.Error(), "order") {
			t.Fatalf("call %d: %v, want ErrForward saying the answers came out of order", i+1, err)
		}
	}
	waitAttached(t, n.m, 0)
}

// TestWindow_GoneWithTwoInFlight: a replica that goes away holding two
// batches: both run on another replica, none fails.
func TestWindow_GoneWithTwoInFlight(t *testing.T) {
	n := serveModel(t, "", attachedConfig(8))
	release := make(chan struct{})
	a := attachReplicaWindow(t, n.addr, 1, 2, func(int) bool { <-release; return false })
	waitAttached(t, n.m, 1)
	c := dial(t, n.addr, "", "bytes")
	call1 := c.Go(ctxT(t), rowsOf(t, 5, 3))
	gotWithin(t, a, "the first batch")
	call2 := c.Go(ctxT(t), rowsOf(t, 2, 7))
	// The second batch is taken by A's other lane, whether or not A read
	// it yet: no rows wait.
	deadline := time.Now().Add(30 * time.Second)
	for n.m.Stats().Queued != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second batch was not taken")
		}
		time.Sleep(time.Millisecond)
	}
	attachReplica(t, n.addr, 2, nil)
	waitAttached(t, n.m, 2)
	close(release) // A closes its stream, answering neither
	wantAnswer(t, "call 1, run by B", call1, 5, 3, 2)
	wantAnswer(t, "call 2, run by B", call2, 2, 7, 2)
	waitAttached(t, n.m, 1)
	if got := lanes(n.m); got != 1 {
		t.Fatalf("%d lanes left, want B's 1", got)
	}
}

// TestWindow_ErrorSendsTheOtherElsewhere: a replica holding two batches
// fails the first (its module raised): that batch fails, the replica is
// detached, and the second, which it never answered, runs on another.
func TestWindow_ErrorSendsTheOtherElsewhere(t *testing.T) {
	n, st, c := windowOf2(t)
	call1 := c.Go(ctxT(t), rowsOf(t, 5, 3))
	b1, err := st.Recv(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	call2 := c.Go(ctxT(t), rowsOf(t, 2, 7))
	if _, err := st.Recv(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	attachReplica(t, n.addr, 2, nil)
	waitAttached(t, n.m, 2)
	if err := st.Send(ctxT(t), replicaAnswer{Batch: b1.Batch, Error: "ValueError: boom"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := call1.Wait(); !errors.Is(err, ErrForward) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("the failed batch: %v, want ErrForward with the replica's message", err)
	}
	wantAnswer(t, "the other batch, run by B", call2, 2, 7, 2)
	waitAttached(t, n.m, 1)
}

// TestWindow_LeavesTogether: a replica of 4 lanes that closes its stream
// while idle leaves no lane behind, which would take a batch only to fail
// it on a stream that is gone.
func TestWindow_LeavesTogether(t *testing.T) {
	n := serveModel(t, "", attachedConfig(8))
	a := attachReplicaWindow(t, n.addr, 1, 4, nil)
	waitAttached(t, n.m, 1)
	if got := lanes(n.m); got != 4 {
		t.Fatalf("%d lanes, want 4", got)
	}
	a.st.Close()
	waitAttached(t, n.m, 0)
	deadline := time.Now().Add(30 * time.Second)
	for lanes(n.m) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes left after the replica went away, want 0", lanes(n.m))
		}
		time.Sleep(time.Millisecond)
	}
	if st := n.m.Stats(); st.Attached != 1 || st.Detached != 1 {
		t.Fatalf("attached %d, detached %d; want 1 and 1 (a replica, not its lanes)", st.Attached, st.Detached)
	}
}
