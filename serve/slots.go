package serve

import (
	"context"
	"sync"
)

// slotRanges hands out runs of a client's slots to the calls that use
// them (Predict, Go): first fit, waiting for a run to free up.
//
// It is the minimal bookkeeping a client needs: which of its own rows are
// in use, in its own process. The node needs no more: a request names its
// rows, and a registration's lease frees them all when the client dies.
type slotRanges struct {
	mu      sync.Mutex
	used    []bool
	changed chan struct{} // closed, and replaced, whenever slots free up
	closed  bool
	calls   sync.WaitGroup // calls holding slots
}

func newSlotRanges(n int) *slotRanges {
	return &slotRanges{used: make([]bool, n), changed: make(chan struct{})}
}

// take returns the first slot of a free run of n, which the caller gives
// back with put; it waits for one until ctx ends or close.
func (s *slotRanges) take(ctx context.Context, n int) (int, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, ErrClosed
		}
		run := 0
		for i, u := range s.used {
			if u {
				run = 0
				continue
			}
			if run++; run == n {
				start := i - n + 1
				for j := start; j <= i; j++ {
					s.used[j] = true
				}
				s.calls.Add(1)
				s.mu.Unlock()
				return start, nil
			}
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// put gives back the run of n at start.
func (s *slotRanges) put(start, n int) {
	s.mu.Lock()
	for j := start; j < start+n; j++ {
		s.used[j] = false
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	s.calls.Done()
}

// close makes take fail from now on and wakes those waiting.
func (s *slotRanges) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// wait waits for the calls holding slots to give them back; after close.
func (s *slotRanges) wait() { s.calls.Wait() }
