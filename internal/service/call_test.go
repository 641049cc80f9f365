package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

var errClosed = errors.New("pkg: closed")

const (
	methodRead  = "fake.read"  // repeatable
	methodWrite = "fake.write" // not
)

var fakeMethods = Methods{methodRead: true}

type fakeRequest struct {
	Fail int    `codec:"fail"` // the node answers Unavailable to the first Fail calls
	Code string `codec:"code"` // then this code ("" for none)
}

// fakeNode serves methodRead and methodWrite on loopback, counting their
// calls: each fails as its request says.
func fakeNode(t *testing.T) (*rpc.Server, string, *atomic.Int64) {
	t.Helper()
	s, err := rpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	handler := func(_ context.Context, req fakeRequest) (rpc.Empty, error) {
		n := calls.Add(1)
		switch {
		case n <= int64(req.Fail):
			return rpc.Empty{}, rpc.Errorf(rpc.Unavailable, "the node is not ready (%d)", n)
		case req.Code == "notfound":
			return rpc.Empty{}, rpc.Errorf(rpc.NotFound, "no such thing")
		}
		return rpc.Empty{}, nil
	}
	for _, m := range []string{methodRead, methodWrite} {
		if err := rpc.Register(s, m, handler); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return s, l.Addr().String(), &calls
}

func dialFake(t *testing.T, addr string) (*Caller, *atomic.Bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := rpc.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	var closed atomic.Bool
	return &Caller{RPC: rc, Methods: fakeMethods, Closed: closed.Load, ErrClosed: errClosed}, &closed
}

// TestCall_Policy: a node that answers Unavailable N times gets a
// repeatable method N+1 times and a method not marked once: its request
// reached the node. The node's other errors are its answer.
func TestCall_Policy(t *testing.T) {
	tests := []struct {
		name      string
		method    string
		req       fakeRequest
		timeout   time.Duration
		wantCalls int64 // 0: more than one, until the timeout
		want      error // nil, or what the error matches
	}{
		{"repeatable, answered at once", methodRead, fakeRequest{}, 0, 1, nil},
		{"repeatable, unavailable 3 times", methodRead, fakeRequest{Fail: 3}, 0, 4, nil},
		{"repeatable, unavailable then not found", methodRead, fakeRequest{Fail: 2, Code: "notfound"}, 0, 3, rpc.ErrNotFound},
		{"repeatable, not found is final", methodRead, fakeRequest{Code: "notfound"}, 0, 1, rpc.ErrNotFound},
		// Long enough for a few attempts on a loaded machine (200 ms failed
		// once with five packages testing on 2 cores).
		{"repeatable, until the context ends", methodRead, fakeRequest{Fail: 1 << 30}, 2 * time.Second, 0, context.DeadlineExceeded},
		{"not repeatable, answered at once", methodWrite, fakeRequest{}, 0, 1, nil},
		{"not repeatable, sent and unavailable", methodWrite, fakeRequest{Fail: 3}, 0, 1, rpc.ErrUnavailable},
		{"not marked at all", "fake.unknown", fakeRequest{}, 0, 0, rpc.ErrUnimplemented},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, addr, calls := fakeNode(t)
			c, _ := dialFake(t, addr)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if tt.timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tt.timeout)
			}
			defer cancel()
			_, err := Call[rpc.Empty](ctx, c, tt.method, tt.req)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			switch n := calls.Load(); {
			case tt.wantCalls > 0 && n != tt.wantCalls:
				t.Errorf("the node got %d calls, want %d", n, tt.wantCalls)
			case tt.wantCalls == 0 && tt.want == context.DeadlineExceeded && n < 2:
				t.Errorf("the node got %d calls, want it tried again", n)
			}
			if tt.want == context.DeadlineExceeded && !errors.Is(err, rpc.ErrUnavailable) {
				t.Errorf("err = %v, want it to wrap the last Unavailable", err)
			}
		})
	}
}

// TestCall_NotSent: a method not marked repeatable is tried again while
// the node cannot be dialed: its request never left.
func TestCall_NotSent(t *testing.T) {
	s, addr, _ := fakeNode(t)
	c, _ := dialFake(t, addr)
	if _, err := Call[rpc.Empty](context.Background(), c, methodWrite, fakeRequest{}); err != nil {
		t.Fatal(err)
	}
	s.Close() // the port refuses from now on
	// The first call after may still go out on the connection the node
	// closed (sent: not NotSent); wait until a call finds it gone.
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := rpc.Call[rpc.Empty](context.Background(), c.RPC, methodRead, fakeRequest{})
		if NotSent(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls to a closed node fail with %v, never a refused dial", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var attempts int
	var notSent bool
	err := c.Retry(ctx, methodWrite, func() error {
		attempts++
		_, err := rpc.Call[rpc.Empty](ctx, c.RPC, methodWrite, fakeRequest{})
		notSent = notSent || NotSent(err)
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("err = %v, want the deadline, wrapping Unavailable", err)
	}
	if !notSent || attempts < 2 {
		t.Errorf("%d attempts (a dial refused: %v); want it tried again while the dial is refused", attempts, notSent)
	}
}

// TestCall_Closed: a closed client's calls fail with its ErrClosed, before
// reaching the node, and a call that fails once it is closed does too.
func TestCall_Closed(t *testing.T) {
	_, addr, calls := fakeNode(t)
	c, closed := dialFake(t, addr)
	closed.Store(true)
	if _, err := Call[rpc.Empty](context.Background(), c, methodRead, fakeRequest{}); err != errClosed {
		t.Errorf("closed: err = %v, want %v", err, errClosed)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the node got %d calls from a closed client", n)
	}
	closed.Store(false)
	err := c.Retry(context.Background(), methodRead, func() error {
		closed.Store(true) // Close cut the call
		return rpc.Errorf(rpc.Internal, "cut")
	})
	if err != errClosed {
		t.Errorf("cut by Close: err = %v, want %v", err, errClosed)
	}
	c.RPC.Close()
	closed.Store(false)
	if _, err := Call[rpc.Empty](context.Background(), c, methodRead, fakeRequest{}); err != errClosed {
		t.Errorf("rpc client closed: err = %v, want %v", err, errClosed)
	}
}

// TestRetry_DeadlineDuringAnAttempt: when ctx ends during an attempt that
// follows attempts which found the node unreachable, Retry's error is the
// deadline wrapping Unavailable, as when it ends between two attempts (a
// loaded machine ran TestCall_NotSent's last attempt into its deadline).
func TestRetry_DeadlineDuringAnAttempt(t *testing.T) {
	c := &Caller{Methods: Methods{}, Closed: func() bool { return false }, ErrClosed: errors.New("closed")}
	refused := fmt.Errorf("%w: %w", rpc.ErrUnavailable, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	attempts := 0
	err := c.Retry(ctx, "m", func() error {
		if attempts++; attempts == 1 {
			return refused
		}
		<-ctx.Done() // the deadline comes while the call is out
		return fmt.Errorf("rpc: %w", ctx.Err())
	})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("err = %v after %d attempts, want the deadline, wrapping Unavailable", err, attempts)
	}
}
