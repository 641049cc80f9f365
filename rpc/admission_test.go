package rpc

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestClient_MoreCallsThanTheNodeServesAtOnce: a client with more calls in
// flight than its node serves from one peer (MaxStreamsPerPeer) has the
// rest wait their turn: every call is answered, none is refused.
func TestClient_MoreCallsThanTheNodeServesAtOnce(t *testing.T) {
	l := DefaultLimits()
	l.MaxStreamsPerPeer = 8
	s, addr := startServer(t, WithLimits(l))
	var mu sync.Mutex
	inside, most := 0, 0
	must(t, Register(s, "test.slow", func(ctx context.Context, m echoMsg) (echoMsg, error) {
		mu.Lock()
		inside++
		most = max(most, inside)
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		inside--
		mu.Unlock()
		return m, nil
	}))
	c := dial(t, addr, WithLimits(l))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const calls = 200
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			got, err := Call[echoMsg](ctx, c, "test.slow", echoMsg{N: i})
			if err == nil && got.N != i {
				t.Errorf("call %d answered %d", i, got.N)
			}
			errs <- err
		}()
	}
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if most > l.MaxStreamsPerPeer {
		t.Errorf("the node ran %d handlers of one client at once, over its limit of %d", most, l.MaxStreamsPerPeer)
	}
}
