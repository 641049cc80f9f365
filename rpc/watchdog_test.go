package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// freezer is a TCP proxy that can cut the network without closing anything,
// as a pulled cable or a partition does: while frozen it forwards no byte
// either way and new connections hang before the handshake.
type freezer struct {
	addr string

	mu     sync.Mutex
	frozen bool
	thaw   chan struct{} // closed when the proxy thaws
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{addr: l.Addr().String(), thaw: make(chan struct{})}
	close(f.thaw)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		f.setFrozen(false)
		conns.Wait()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			conns.Add(2)
			go func() { defer conns.Done(); f.pipe(up, c) }()
			go func() { defer conns.Done(); f.pipe(c, up) }()
		}
	}()
	return f
}

// pipe copies from src to dst, holding each chunk while the proxy is frozen.
func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		thaw := f.thaw
		f.mu.Unlock()
		<-thaw
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

func (f *freezer) setFrozen(frozen bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if frozen == f.frozen {
		return
	}
	f.frozen = frozen
	if frozen {
		f.thaw = make(chan struct{})
	} else {
		close(f.thaw)
	}
}

const testKeepAlive = 100 * time.Millisecond

func TestWatchdog_PartitionedNode(t *testing.T) {
	n := startTestNode(t)
	f := startFreezer(t, n.addr)
	c := dial(t, f.addr, WithKeepAlive(testKeepAlive))
	echo(t, c)

	f.setFrozen(true)
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

	f.setFrozen(false)
	echo(t, c) // the same client, a new connection
}

// A node whose handler takes many keep-alive intervals is slow, not gone:
// it answers pings, and the call gets its result.
func TestWatchdog_SlowHandlerIsNotSilence(t *testing.T) {
	n := startTestNode(t)
	c := dial(t, n.addr, WithKeepAlive(testKeepAlive))
	res := Go[echoMsg](context.Background(), c, methodBlock, echoMsg{N: 7})
	<-n.started
	time.Sleep(10 * testKeepAlive)
	close(n.release)
	if got, err := res.Wait(); err != nil || got.N != 7 {
		t.Fatalf("slow call = %+v, %v", got, err)
	}

	// And a slow call whose deadline passes is DeadlineExceeded.
	ctx, cancel := context.WithTimeout(context.Background(), 5*testKeepAlive)
	defer cancel()
	n2 := startTestNode(t)
	c2 := dial(t, n2.addr, WithKeepAlive(testKeepAlive))
	if _, err := Call[echoMsg](ctx, c2, methodBlock, echoMsg{}); !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("slow call past its deadline: %v, want DeadlineExceeded", err)
	}
}

// A dial that cannot finish before the deadline is Unavailable (the node
// could not be reached) and matches context.DeadlineExceeded.
func TestDial_UnreachableBeforeDeadline(t *testing.T) {
	n := startTestNode(t)
	f := startFreezer(t, n.addr)
	f.setFrozen(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, f.addr)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial through a partition: %v, want Unavailable and DeadlineExceeded", err)
	}
}
