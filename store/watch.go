package store

import (
	"context"
	"iter"
	"math"
	"sort"
	"time"
)

// Op is what an event did.
type Op uint8

// The ops. Their numbers are the protocol (docs/store.md): never change one.
// Each is the event of a kind of log record, whose row (records.go) names it.
const (
	OpPut     Op = 1 // a bin's content replaced by one item
	OpAppend  Op = 2 // an item added to a bin
	OpGet     Op = 3 // items removed from a bin by a Get
	OpDelete  Op = 4 // a bin removed
	OpPublish Op = 5 // a version of a parameter set published
)

// Event is one change of a store: every Put, Append, acknowledged Get,
// Delete and Publish makes one (Peek and List make none). Revisions number
// the events of a store from 1, without gaps, in the order they happened,
// and survive restarts.
type Event struct {
	Revision uint64 `codec:"rev"`
	Op       Op     `codec:"op"`
	Name     string `codec:"name"`    // the bin, or the parameter set (OpPublish)
	Items    int    `codec:"items"`   // items in the bin after the event
	Version  uint64 `codec:"version"` // OpPublish: the version published
}

// FromNow, as Watch's after, watches from the store's current revision:
// only events that happen from now on.
const FromNow uint64 = math.MaxUint64

// history keeps the latest events, for watchers to read and resume from.
type history struct {
	ev    []Event
	max   int
	floor uint64 // events up to this revision are not kept
}

func (h *history) add(e Event) {
	h.ev = append(h.ev, e)
	if len(h.ev) > 2*h.max {
		drop := len(h.ev) - h.max
		h.floor = h.ev[drop-1].Revision
		h.ev = append([]Event(nil), h.ev[drop:]...)
	}
}

// watchMaxWait is how long a watch stream goes without a message: after it
// the node sends the revision it has looked up to, alone.
const watchMaxWait = 10 * time.Second

// watchMaxEvents bounds the events of one watch message.
const watchMaxEvents = 4096

// watchEvents returns the durable events after revision after whose names
// start with prefix, waiting until there is at least one, maxWait passes
// (then none), or ctx ends. seen is the revision it looked up to: the
// next call passes it as after. after == FromNow starts from the current
// revision. An after older than the events kept is ErrCompacted; so is a
// store id other than id, when id is not "" (the store was created anew).
func (s *Store) watchEvents(ctx context.Context, id, prefix string, after uint64, maxWait time.Duration) (evs []Event, seen uint64, err error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, 0, err
	}
	var timeout <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		s.mu.Lock()
		if err := s.enterLocked(); err != nil {
			s.mu.Unlock()
			return nil, 0, err
		}
		if id != "" && id != s.id {
			s.mu.Unlock()
			return nil, 0, errorf(ErrCompacted, "the store was created anew (id %s, was %s)", s.id, id)
		}
		if after == FromNow {
			after = s.durable
		}
		if after < s.hist.floor {
			floor := s.hist.floor
			s.mu.Unlock()
			return nil, 0, errorf(ErrCompacted, "events after revision %d asked for; the store keeps those after %d", after, floor)
		}
		if after > s.rev {
			rev := s.rev
			s.mu.Unlock()
			return nil, 0, errorf(ErrCompacted, "events after revision %d asked for; the store is at %d (it lost events, or is another store)", after, rev)
		}
		seen = s.durable
		evs = s.hist.match(prefix, after, seen, watchMaxEvents)
		if n := len(evs); n == watchMaxEvents {
			seen = evs[n-1].Revision
		}
		ch := s.notify
		s.mu.Unlock()
		if len(evs) > 0 {
			return evs, seen, nil
		}
		after = seen
		select {
		case <-ch:
		case <-timeout:
			return nil, seen, nil
		case <-ctx.Done():
			return nil, seen, ctx.Err()
		case <-s.done:
			return nil, seen, ErrClosed
		}
	}
}

// match returns up to n events in (after, upto] whose names start with
// prefix.
func (h *history) match(prefix string, after, upto uint64, n int) []Event {
	i := sort.Search(len(h.ev), func(i int) bool { return h.ev[i].Revision > after })
	var out []Event
	for ; i < len(h.ev) && h.ev[i].Revision <= upto && len(out) < n; i++ {
		if hasPrefix(h.ev[i].Name, prefix) {
			out = append(out, h.ev[i])
		}
	}
	return out
}

// Watch returns the events whose bin or parameter-set names start with
// prefix ("" for all), from the first after revision after (FromNow: from
// now on), in revision order, as they happen, until ctx ends. Each event
// is durable when it is delivered. An after older than the events the
// store keeps yields ErrCompacted: read the state again (List) and watch
// from its revision. The sequence ends after yielding an error.
func (s *Store) Watch(ctx context.Context, prefix string, after uint64) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		for {
			evs, seen, err := s.watchEvents(ctx, "", prefix, after, 0)
			if err != nil {
				yield(Event{}, err)
				return
			}
			for _, e := range evs {
				if !yield(e, nil) {
					return
				}
			}
			after = seen
		}
	}
}
