package serve

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// bellClient dials the model by reference and checks that it goes by bell.
func bellClient(t *testing.T, addr, root string, opts ...DialOption) *Client {
	t.Helper()
	if !bellSupported {
		t.Skip("requests by bell need Linux")
	}
	c := dial(t, addr, root, "ref", opts...)
	if c.ring == nil || c.ring.bell == nil {
		t.Fatal("the client by reference has no bell")
	}
	return c
}

// TestBell_PredictCrossesNoSocket: a prediction by reference goes by bell:
// not a byte crosses the connection.
func TestBell_PredictCrossesNoSocket(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	p := proctest.StartProxy(t, n.addr)
	c := bellClient(t, p.Addr, root)
	up, down := p.Up.Load(), p.Down.Load()
	for i := range 20 {
		out, _, err := c.Predict(ctxT(t), rowsOf(t, i, 1+i%4))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checkOutputs(out, i, 1+i%4, 0); err != nil {
			t.Fatal(err)
		}
	}
	if u, d := p.Up.Load()-up, p.Down.Load()-down; u != 0 || d != 0 {
		t.Errorf("20 predictions by bell sent %d bytes up and %d down; want none", u, d)
	}
}

// TestBell_BadEntry: an entry for rows outside the client's slots, or more
// rows than the max batch, written into the ring as a broken client would,
// fails with ErrSchema (fetched by call), and nothing is queued.
func TestBell_BadEntry(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	c := bellClient(t, n.addr, root, WithSlots(4))
	for _, e := range []struct{ start, n int }{{3, 2}, {0, 5}, {0, 0}} {
		start := min(e.start, 3)
		seq, err := c.pushRaw(start, makeEntry(e.start, e.n, 0))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.waitBell(ctxT(t), start, seq, c.gen.Load())
		if !errors.Is(err, ErrSchema) || !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("entry rows [%d, %d): %v, want ErrSchema", e.start, e.start+e.n, err)
		}
	}
	if st := n.m.Stats(); st.Requests != 0 {
		t.Errorf("%d requests queued", st.Requests)
	}
	if _, _, err := c.Predict(ctxT(t), rowsOf(t, 1, 2)); err != nil {
		t.Errorf("after the bad entries: %v", err)
	}
}

// pushRaw appends entry e (its sequence number replaced by the next one
// at start) and rings the bell, as push does, without checking it.
func (c *Client) pushRaw(start int, e uint64) (uint32, error) {
	r := c.ring
	r.mu.Lock()
	defer r.mu.Unlock()
	seq := r.seq[start] + 1
	r.seq[start] = seq
	t := r.v.tail().Load()
	r.v.entry(t).Store(e&^entrySeqMask | uint64(seq))
	r.v.tail().Store(t + 1)
	r.bell.Uint32(bellRing).Add(1)
	r.bell.Uint32(bellRing).Wake()
	return seq, nil
}

// TestBell_TruncatedRing: a client's ring file truncated under the node
// ends that client's registration, not the node: its poller reads the
// rings under a fault guard. Another client goes on.
func TestBell_TruncatedRing(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	broken := bellClient(t, n.addr, root)
	ok := bellClient(t, n.addr, root)
	if err := os.Truncate(filepath.Join(broken.dir, "ring"), 0); err != nil {
		t.Fatal(err)
	}
	poll(t, "the node to drop the broken client", func() bool {
		s, _ := n.svc.lookup("model")
		s.mu.Lock()
		defer s.mu.Unlock()
		_, held := s.clients[broken.id]
		return !held
	})
	for i := range 10 {
		if _, _, err := ok.Predict(ctxT(t), rowsOf(t, i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	// The broken client's own mapping of its ring faults too: it is only
	// closed (t.Cleanup).
}

// TestBell_DeadNodeFoldersRemoved: a client that dials removes the bell
// folders of nodes that died (their lock free), and leaves a live node's.
func TestBell_DeadNodeFoldersRemoved(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	bellClient(t, n.addr, root) // makes the live node's bell
	dead := filepath.Join(root, BellsDir, "00000000000000dd")
	if err := os.MkdirAll(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dead, "bell"), make([]byte, bellSize), 0o644)
	bellClient(t, n.addr, root)
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead node's bell folder: %v", err)
	}
	live, _ := filepath.Glob(filepath.Join(root, BellsDir, "*", "bell"))
	if len(live) != 1 {
		t.Errorf("bells left: %v, want the live node's", live)
	}
	n.svc.Close()
	if left, _ := filepath.Glob(filepath.Join(root, BellsDir, "*")); len(left) != 0 {
		t.Errorf("after Service.Close: %v", left)
	}
}

// TestBell_CanceledPredictKeepsItsSlots: a Predict whose context ends
// while its batch runs keeps its slots until the node is done writing
// them, so that no later Predict gets them meanwhile.
func TestBell_CanceledPredictKeepsItsSlots(t *testing.T) {
	root := t.TempDir()
	b := &behaviour{gate: make(chan struct{}), started: make(chan int, 10)}
	n := serveModel(t, root, testConfig(b, 4))
	c := bellClient(t, n.addr, root, WithSlots(1))
	ctx, cancel := contextWithCancel(t)
	errc := make(chan error, 1)
	go func() {
		_, _, err := c.Predict(ctx, rowsOf(t, 1, 1))
		errc <- err
	}()
	<-b.started // its batch runs
	cancel()
	if err := <-errc; !errors.Is(err, errCanceled) {
		t.Fatalf("canceled Predict: %v", err)
	}
	slotUsed := func() bool {
		c.free.mu.Lock()
		defer c.free.mu.Unlock()
		return c.free.used[0]
	}
	if !slotUsed() {
		t.Fatal("the canceled Predict gave its slot back while the node still runs its request")
	}
	close(b.gate)
	poll(t, "the slot to be given back once the node answered", func() bool { return !slotUsed() })
	out, _, err := c.Predict(ctxT(t), rowsOf(t, 50, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkOutputs(out, 50, 1, 0); err != nil {
		t.Error(err)
	}
}

// TestBell_EntryOutsideTheSlots: an entry whose first row is not one of
// the client's slots has no record to be answered in. The node writes
// nothing for it (before, it wrote a record past the client's records,
// into the rest of its ring file, and kept its failure) and drops the
// client's registration, as for a ring holding more entries than slots;
// the client registers again by itself, and predicts on.
func TestBell_EntryOutsideTheSlots(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	c := bellClient(t, n.addr, root, WithSlots(4))
	first := c.id
	size, records := ringSize(4)
	if _, err := c.pushRaw(0, makeEntry(100, 1, 0)); err != nil {
		t.Fatal(err)
	}
	s, _ := n.svc.lookup("model")
	poll(t, "the node to drop the client", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, held := s.clients[first]
		return !held
	})
	for i := records + recordSize*4; i < size; i++ {
		if c.ring.v.b.Bytes()[i] != 0 {
			t.Fatalf("the node wrote byte %d of the ring, past the records of its 4 slots (%d to %d)", i, records, records+recordSize*4)
		}
	}
	for i := range 5 {
		out, _, err := c.Predict(ctxT(t), rowsOf(t, i, 1+i%4))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checkOutputs(out, i, 1+i%4, 0); err != nil {
			t.Fatal(err)
		}
	}
	if c.id == first {
		t.Error("the client did not register again")
	}
}

// TestBell_RemoveWhileARequestRunsKeepsTheNode removes the model (as
// Service.Close does, before the managers close, when a node stops) while
// a request by bell is in a running batch. The node lives on: the
// request's ring stays mapped while the request holds it and is unmapped
// once it ends, and the request is not answered (its registration was
// dropped), so its client finds the model gone. Before, the poller
// unmapped the ring at Remove and the replica answered into it: a bounds
// panic outside any recover killed the node. The node runs in a child
// process, so that a crash fails this test and not the test binary.
func TestBell_RemoveWhileARequestRunsKeepsTheNode(t *testing.T) {
	if !bellSupported {
		t.Skip("requests by bell need Linux")
	}
	if os.Getenv("SERVE_TEST_REMOVE_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBell_RemoveWhileARequestRunsKeepsTheNode$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "SERVE_TEST_REMOVE_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			t.Fatalf("the node's process: %v\n%s", err, strings.Join(lines[:min(len(lines), 20)], "\n"))
		}
		return
	}
	root := t.TempDir()
	b := &behaviour{gate: make(chan struct{}), started: make(chan int, 10)}
	n := serveModel(t, root, testConfig(b, 4))
	c := bellClient(t, n.addr, root)
	s, _ := n.svc.lookup("model")
	s.mu.Lock()
	r := s.clients[c.id]
	s.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		_, _, err := c.Predict(ctxT(t), rowsOf(t, 1, 1))
		errc <- err
	}()
	<-b.started // the request's batch runs
	n.svc.Remove("model")
	mapped := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return r.ring.b.Len() > 0
	}
	if !mapped() {
		t.Fatal("Remove unmapped the ring of a request in a batch")
	}
	close(b.gate) // the batch ends
	if err := <-errc; !errors.Is(err, ErrNotFound) {
		t.Errorf("the request in a batch at Remove: %v; want ErrNotFound", err)
	}
	poll(t, "the ring to be unmapped once its request ended", func() bool { return !mapped() })
	if st := n.m.Stats(); st.Batches != 1 {
		t.Errorf("%d batches, want 1", st.Batches)
	}
}

// TestBell_ResentRequestIsAnsweredOnce: a node drops a live client's
// registration (its lease ran out: renewals lost) while a request by bell
// is in a batch. The client registers again and sends the request again,
// which another replica answers; the caller goes on, with new inputs in
// the same rows and another prediction. When the first batch ends, the
// node writes nothing for its request, of a registration it dropped: the
// rows keep the later request's outputs. Before, it wrote the first
// request's outputs over them.
// heldFirstBatch serves a model on two replicas whose first forward waits
// until hold is sent on (or closed), after closing started; the other
// replica answers meanwhile. The client has one slot.
func heldFirstBatch(t *testing.T) (n *node, c *Client, hold, started chan struct{}) {
	t.Helper()
	root := t.TempDir()
	hold, started = make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	b := &behaviour{forward: func(int) error {
		if calls.Add(1) == 1 {
			close(started)
			<-hold
		}
		return nil
	}}
	cfg := testConfig(b, 4)
	cfg.Replicas = 2
	n = serveModel(t, root, cfg)
	return n, bellClient(t, n.addr, root, WithSlots(1)), hold, started
}

// setRow0 writes request id's inputs into c's row 0.
func setRow0(t *testing.T, c *Client, id int) {
	t.Helper()
	if err := c.Input().SetSlice(0, rowsOf(t, id, 1)); err != nil {
		t.Fatal(err)
	}
}

// row0 returns a copy of c's output row 0.
func row0(t *testing.T, c *Client) *tensordict.TensorDict {
	t.Helper()
	s, err := c.Output().Slice(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Clone()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBell_ResentRequestIsAnsweredOnce(t *testing.T) {
	n, c, hold, started := heldFirstBatch(t)
	defer close(hold)
	setRow := func(id int) { setRow0(t, c, id) }
	setRow(1)
	errc := make(chan error, 1)
	go func() {
		_, err := c.PredictInto(ctxT(t), 0, 1)
		errc <- err
	}()
	<-started // the request's batch runs on one replica, held there
	// Its lease runs out, as sweep finds it.
	s, _ := n.svc.lookup("model")
	s.mu.Lock()
	first := s.clients[c.id]
	first.expires = time.Time{}
	s.mu.Unlock()
	s.sweep()
	// The client finds it out, registers again and sends the request
	// again: the other replica answers it.
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the request was not answered")
	}
	setRow(100)
	if _, err := c.PredictInto(ctxT(t), 0, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := checkOutputs(row0(t, c), 100, 1, 0); err != nil {
		t.Fatalf("before the first batch ended: %v", err)
	}
	hold <- struct{}{} // the first request's batch ends
	poll(t, "the first request to end", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return first.refs == 0
	})
	if _, err := checkOutputs(row0(t, c), 100, 1, 0); err != nil {
		t.Errorf("the outputs of the last request, once the first batch ended: %v", err)
	}
}

// TestBell_CloseReturnsWithAFullRing: the node is gone (its server and
// service closed, as when it is killed), and a request by bell whose
// context ended left its entry in the ring of a client with one slot,
// which nobody takes: the ring is full. The next request waits for room;
// Close makes it fail with ErrClosed and returns. Before, it waited for
// room forever, looking at neither Close nor the registration, and Close,
// which waits for the requests by bell, never returned.
func TestBell_CloseReturnsWithAFullRing(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	c := bellClient(t, n.addr, root, WithSlots(1))
	n.srv.Close()
	n.svc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.PredictInto(ctx, 0, 1); err == nil {
		t.Fatal("a prediction with no node succeeded")
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.PredictInto(context.Background(), 0, 1) // the ring is full: it waits for room
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s: a request by bell waits for room in a full ring")
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("the request waiting for room: %v; want ErrClosed", err)
	}
}
