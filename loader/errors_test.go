package loader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// wireErrors pins each sentinel's code and reason: the reasons are part of
// the protocol (docs/loader.md, "Errors"); the messages are not.
var wireErrors = []struct {
	err    error
	code   error // the code's rpc sentinel
	reason string
}{
	{ErrConfig, rpc.ErrInvalidArgument, "loader.config"},
	{ErrDataset, rpc.ErrFailedPrecondition, "loader.dataset"},
	{ErrArgument, rpc.ErrInvalidArgument, "loader.argument"},
	{ErrNotFound, rpc.ErrNotFound, "loader.not_found"},
	{ErrDropped, rpc.ErrAborted, "loader.dropped"},
	{ErrClosed, rpc.ErrFailedPrecondition, "loader.closed"},
	{ErrFailed, rpc.ErrFailedPrecondition, "loader.failed"},
	{ErrInUse, rpc.ErrFailedPrecondition, "loader.in_use"},
	{ErrExists, rpc.ErrAlreadyExists, "loader.exists"},
}

type failRequest struct {
	I int `codec:"i"`
}

// TestErrors_CrossTheWire has a handler return each sentinel in a message
// that does not begin with the sentinel's text: the caller's error carries
// the sentinel's reason and matches the sentinel and its code, and no other
// sentinel.
func TestErrors_CrossTheWire(t *testing.T) {
	s, err := rpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	err = rpc.Register(s, "loadertest.fail", func(_ context.Context, req failRequest) (rpc.Empty, error) {
		return rpc.Empty{}, fmt.Errorf("reworded, the sentinel's text last: %w", wireErrors[req.I].err)
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for i, w := range wireErrors {
		t.Run(w.err.Error(), func(t *testing.T) {
			_, err := rpc.Call[rpc.Empty](ctx, c, "loadertest.fail", failRequest{I: i})
			if !errors.Is(err, w.err) || !errors.Is(err, w.code) {
				t.Fatalf("%v: want it to match %v and %v", err, w.err, w.code)
			}
			if re, ok := errors.AsType[*rpc.Error](err); !ok || re.Reason != w.reason {
				t.Fatalf("%#v: want the reason %q", err, w.reason)
			}
			for _, other := range wireErrors {
				if other.err != w.err && errors.Is(err, other.err) {
					t.Errorf("%v also matches %v", err, other.err)
				}
			}
		})
	}
}
