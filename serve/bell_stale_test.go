package serve

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// TestBell_LateAnswerOfAnAbandonedRequestIsNotWritten: a request by bell
// whose context ended while its batch was held on one replica keeps its
// slot for the client's quiet bound, then gives it back; the next request
// on that slot, with new inputs, is answered by the other replica. When
// the first batch ends at last, its outputs and record are not written:
// the node took a newer request for that row since. Before, they were,
// over the newer request's outputs, which the caller had been told were
// ready: a wrong row.
func TestBell_LateAnswerOfAnAbandonedRequestIsNotWritten(t *testing.T) {
	root := t.TempDir()
	hold := make(chan struct{})
	started := make(chan struct{})
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
	n := serveModel(t, root, cfg)
	c := bellClient(t, n.addr, root, WithSlots(1))
	c.quiet = 200 * time.Millisecond
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	row0 := func() *tensordict.TensorDict {
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
	if err := c.Input().SetSlice(0, rowsOf(t, 1, 1)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() {
		_, err := c.PredictInto(ctx, 0, 1)
		errc <- err
	}()
	<-started // its batch runs on one replica, held there
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the abandoned request: %v", err)
	}
	// The slot comes back after c.quiet; the next request on it, with new
	// inputs, runs on the other replica.
	if err := c.Input().SetSlice(0, rowsOf(t, 100, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PredictInto(ctxT(t), 0, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := checkOutputs(row0(), 100, 1, 0); err != nil {
		t.Fatalf("before the first batch ended: %v", err)
	}
	released = true
	close(hold) // the first request's batch ends
	s, _ := n.svc.lookup("model")
	poll(t, "the first request to end", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.clients[c.id].refs == 0
	})
	if _, err := checkOutputs(row0(), 100, 1, 0); err != nil {
		t.Errorf("the outputs of the last request, once the first batch ended: %v", err)
	}
}
