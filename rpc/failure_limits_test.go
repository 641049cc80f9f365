package rpc

// Failure tests (failure_test.go): callers that give up, and the server's
// limits on streams, gathers and idle streams.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// ---- deadlines and cancellation ----

func TestCall_CallerGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline bool
		want     []error
	}{
		{"deadline", true, []error{ErrDeadlineExceeded, context.DeadlineExceeded}},
		{"cancel", false, []error{ErrCanceled, context.Canceled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTestNode(t)
			c := dial(t, n.addr)
			echo(t, c) // a pooled stream, so the call below reuses it
			var ctx context.Context
			var cancel context.CancelFunc
			if tc.deadline {
				ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
			} else {
				ctx, cancel = context.WithCancel(context.Background())
				go func() {
					<-n.started
					time.Sleep(50 * time.Millisecond)
					cancel()
				}()
			}
			defer cancel()
			start := time.Now()
			_, err := Call[echoMsg](ctx, c, methodBlock, echoMsg{})
			if took := time.Since(start); took > 30*time.Second {
				t.Fatalf("the call took %v to give up", took)
			}
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want it to match %v", err, want)
				}
			}
			select {
			case herr := <-n.ended:
				if herr == nil {
					t.Fatal("the handler's context did not end")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the handler did not see its context end within 30 s")
			}
			echo(t, c)
		})
	}
	t.Run("deadline centuries away", func(t *testing.T) {
		// The largest timeout_us a client sends (time.Until saturates at
		// 292 years) must not overflow into a deadline in the past.
		n := startTestNode(t)
		c := dial(t, n.addr)
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().AddDate(1000, 0, 0))
		defer cancel()
		if _, err := Call[echoMsg](ctx, c, methodRecord, echoMsg{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("timeout_us past a Duration", func(t *testing.T) {
		// A peer may send any timeout_us; one past what a time.Duration
		// holds (292 years) is clamped to it. It wrapped to a deadline in
		// the past before, and the call failed with DeadlineExceeded at once.
		ctx, cancel := callContext(context.Background(), math.MaxInt64)
		defer cancel()
		if d, ok := ctx.Deadline(); ctx.Err() != nil || !ok || time.Until(d) < 200*365*24*time.Hour {
			t.Fatalf("a call's context for timeout_us %d: deadline %v, err %v; want one centuries away", int64(math.MaxInt64), d, ctx.Err())
		}
	})
	t.Run("already expired", func(t *testing.T) {
		n := startTestNode(t)
		c := dial(t, n.addr)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := Call[echoMsg](ctx, c, methodRecord, echoMsg{}); !errors.Is(err, ErrCanceled) {
			t.Fatalf("err = %v, want Canceled", err)
		}
		if n.calls.Load() != 0 {
			t.Fatal("a cancelled call ran")
		}
		echo(t, c)
	})
}

// ---- limits ----

func TestServer_StreamLimit(t *testing.T) {
	l := hostileLimits()
	l.MaxStreamsPerPeer = 2
	n := startTestNode(t, WithLimits(l))
	c := dial(t, n.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f1 := Go[echoMsg](ctx, c, methodBlock, echoMsg{N: 1})
	f2 := Go[echoMsg](ctx, c, methodBlock, echoMsg{N: 2})
	<-n.started
	<-n.started
	// Two calls in flight: a third is refused, again and again.
	for i := range 3 {
		if _, err := Call[echoMsg](ctx, c, methodEcho, echoMsg{}); !errors.Is(err, ErrResourceExhausted) {
			t.Fatalf("call %d over the limit: %v, want ResourceExhausted", i, err)
		}
	}
	// Other peers are not limited by this one.
	echo(t, dial(t, n.addr))
	close(n.release)
	for _, f := range []*Future[echoMsg]{f1, f2} {
		if _, err := f.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		echo(t, c)
	}
	// Two at a time fit.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { echo(t, c) })
	}
	wg.Wait()
}

// TestServer_GatherOverLimit asks the built-in services to gather more row
// bytes than MaxBodyBytes, by repeating rows in a small request: refused
// before the memory is taken.
func TestServer_GatherOverLimit(t *testing.T) {
	root := t.TempDir()
	l := hostileLimits()
	l.MaxBodyBytes = 64 << 10
	n := startTestNode(t, WithRoot(root), WithLimits(l))
	seedTD(t, filepath.Join(root, "td"), 10) // rows of 48 bytes
	file := filepath.Join(root, "td", "memmap.memmap")
	before := readFile(t, file)
	c := dial(t, n.addr)
	ctx := context.Background()
	many := make([]int, 2000) // 96 000 bytes of row 0
	if _, err := c.Read(ctx, "td", many); !errors.Is(err, ErrResourceExhausted) {
		t.Fatalf("Read of %d rows: %v, want ResourceExhausted", len(many), err)
	}
	if _, err := c.Read(ctx, "td", many[:1000]); err != nil {
		t.Fatalf("Read of 1000 rows: %v", err)
	}
	p := dialRawIn(t, n.addr, root)
	shape := []int{10, 4, 4, 3}
	dst := refTD("td/memmap.memmap", "uint8", shape, shape, 0, []int{10}, many)
	src := refTD("td/memmap.memmap", "uint8", shape, shape, 0, []int{10}, many)
	rh := p.rawCall(t, MethodFill, &FillRequest{TD: TD{wire: dst}, Src: &TD{wire: src}}, nil)
	if Code(rh.Code) != ResourceExhausted {
		t.Fatalf("fill from %d gathered rows: %v %q, want ResourceExhausted", len(many), Code(rh.Code), rh.Message)
	}
	if !bytes.Equal(readFile(t, file), before) {
		t.Fatal("a refused fill changed the file")
	}
}

// TestServer_IdleStreamsOverLimit checks that streams over the limit that
// send nothing are closed after TransferGrace, not IdleTimeout, so a peer
// cannot hold any number of them open.
func TestServer_IdleStreamsOverLimit(t *testing.T) {
	l := hostileLimits()
	l.MaxStreamsPerPeer = 2
	l.IdleTimeout = time.Minute
	n := startTestNode(t, WithLimits(l))
	p := dialRaw(t, n.addr, nil)
	const streams = 6
	results := make(chan error, streams)
	for range streams {
		st := p.stream(t)
		defer st.Close()
		go func() {
			st.SetReadDeadline(time.Now().Add(l.TransferGrace + 5*time.Second))
			_, err := st.Read(make([]byte, 1))
			results <- err
		}()
	}
	var closed, open int
	for range streams {
		switch err := <-results; {
		case err == io.EOF, errors.Is(err, yamux.ErrConnectionReset): // reset: over yamux's accept backlog
			closed++
		case errors.Is(err, yamux.ErrTimeout):
			open++
		default:
			t.Fatalf("read: %v", err)
		}
	}
	if closed != streams-l.MaxStreamsPerPeer || open != l.MaxStreamsPerPeer {
		t.Fatalf("%d streams closed by the server and %d open, want %d and %d", closed, open, streams-l.MaxStreamsPerPeer, l.MaxStreamsPerPeer)
	}
	echo(t, dial(t, n.addr))
}

// TestClient_StreamIdledOut checks that streams the server closed while
// they sat in the client's pool are not used for calls.
func TestClient_StreamIdledOut(t *testing.T) {
	l := hostileLimits()
	l.IdleTimeout = 200 * time.Millisecond
	n := startTestNode(t, WithLimits(l))
	c := dial(t, n.addr)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { echo(t, c) })
	}
	wg.Wait()
	time.Sleep(aliveCheckAfter + 2*l.IdleTimeout)
	for range 4 {
		echo(t, c)
	}
	for range 4 {
		wg.Go(func() { echo(t, c) })
	}
	wg.Wait()
}
