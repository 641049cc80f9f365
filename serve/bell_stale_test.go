package serve

import (
	"context"
	"errors"
	"testing"
)

// TestBell_LateAnswerOfAnAbandonedRequestIsNotWritten: a PredictInto by
// bell whose context ended while its batch was held on one replica; the
// caller reuses its rows for the next request, with new inputs, which the
// other replica answers. When the first batch ends at last, its outputs
// and record are not written: the node took a newer request for that row
// since. Before, they were, over the newer request's outputs, which the
// caller had been told were ready: a wrong row. (With Predict the same
// happens once the client's quiet bound gives the slots back.)
func TestBell_LateAnswerOfAnAbandonedRequestIsNotWritten(t *testing.T) {
	n, c, hold, started := heldFirstBatch(t)
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	setRow0(t, c, 1)
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
	setRow0(t, c, 100)
	if _, err := c.PredictInto(ctxT(t), 0, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := checkOutputs(row0(t, c), 100, 1, 0); err != nil {
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
	if _, err := checkOutputs(row0(t, c), 100, 1, 0); err != nil {
		t.Errorf("the outputs of the last request, once the first batch ended: %v", err)
	}
}
