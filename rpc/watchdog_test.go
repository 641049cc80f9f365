package rpc

import (
	"context"
	"errors"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"testing"
	"time"
)

const testKeepAlive = 100 * time.Millisecond

func TestWatchdog_PartitionedNode(t *testing.T) {
	n := startTestNode(t)
	f := proctest.StartProxy(t, n.addr)
	c := dial(t, f.Addr, WithKeepAlive(testKeepAlive))
	echo(t, c)

	f.Freeze()
	for _, tc := range []struct {
		name     string
		deadline time.Duration
	}{
		// The deadline passes first, with the node silent for more than
		// an interval and a half: unreachable, not merely slow.
		{"short deadline", 4 * testKeepAlive},
		// The watchdog closes the connection after 5 silent intervals,
		// long before the deadline.
		{"long deadline", 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			start := time.Now()
			_, err := Call[echoMsg](ctx, c, methodEcho, echoMsg{N: 1})
			took := time.Since(start)
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("call across a partition: %v, want Unavailable", err)
			}
			if took > tc.deadline+time.Second || tc.deadline > 10*time.Second && took > 5*time.Second {
				t.Fatalf("call across a partition returned after %v (deadline %v)", took, tc.deadline)
			}
			if d, _ := ctx.Deadline(); time.Now().After(d) != errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%v: matches context.DeadlineExceeded = %v, want it exactly when the deadline passed",
					err, errors.Is(err, context.DeadlineExceeded))
			}
			t.Logf("%v after %v", err, took.Round(time.Millisecond))
		})
	}

	f.Thaw()
	echo(t, c) // the same client, a new connection
}

// A node whose handler takes many keep-alive intervals is slow, not gone:
// it answers pings, and the call gets its result.
func TestWatchdog_SlowHandlerIsNotSilence(t *testing.T) {
	// A keep-alive long enough that a loaded machine answers its pings in
	// time (with 100 ms, the node was declared dead after 500 ms of
	// silence while 2 cores ran 6 processes' worth of tests): what this
	// test shows is a handler outliving the dead threshold, 5 intervals.
	const ka = 400 * time.Millisecond
	n := startTestNode(t)
	c := dial(t, n.addr, WithKeepAlive(ka))
	res := Go[echoMsg](context.Background(), c, methodBlock, echoMsg{N: 7})
	<-n.started
	time.Sleep(deadAfter*ka/2 + 2*ka)
	close(n.release)
	if got, err := res.Wait(); err != nil || got.N != 7 {
		t.Fatalf("slow call = %+v, %v", got, err)
	}

	// And a slow call whose deadline passes (well before the dead
	// threshold) is DeadlineExceeded.
	ctx, cancel := context.WithTimeout(context.Background(), 2*ka)
	defer cancel()
	n2 := startTestNode(t)
	c2 := dial(t, n2.addr, WithKeepAlive(ka))
	if _, err := Call[echoMsg](ctx, c2, methodBlock, echoMsg{}); !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("slow call past its deadline: %v, want DeadlineExceeded", err)
	}
}

// A dial that cannot finish before the deadline is Unavailable (the node
// could not be reached) and matches context.DeadlineExceeded.
func TestDial_UnreachableBeforeDeadline(t *testing.T) {
	n := startTestNode(t)
	f := proctest.StartProxy(t, n.addr)
	f.Freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, f.Addr)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial through a partition: %v, want Unavailable and DeadlineExceeded", err)
	}
}

// TestWatchdog_StarvedTickKeepsEarlierSilence: a tick late by more than
// three ticks (this process starved) does not count the gap as the
// node's silence, and keeps the silence counted before it. Starting the
// count again lost it, and a call across a partition on a loaded machine
// then ended DeadlineExceeded instead of Unavailable.
func TestWatchdog_StarvedTickKeepsEarlierSilence(t *testing.T) {
	const tick = 25 * time.Millisecond
	w := &watchdog{fc: &frameConn{}, interval: 4 * tick}
	t0 := time.Unix(1000, 0)
	w.silent.Store(t0.UnixNano())
	now := t0
	for range 4 { // 100 ms of silence, on time
		now = now.Add(tick)
		w.tick(now, now.Add(-tick), tick)
	}
	late := now.Add(300 * time.Millisecond) // starved for 300 ms
	if q := w.tick(late, now, tick); q != 4*tick+tick {
		t.Fatalf("after a starved tick the node counts silent for %v, want %v (the silence before the gap and one tick)", q, 5*tick)
	}
	w.fc.reads.Add(1) // then it speaks
	if q := w.tick(late.Add(tick), late, tick); q != 0 {
		t.Fatalf("after a read the node counts silent for %v, want 0", q)
	}
}
