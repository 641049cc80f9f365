package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/tensorwire/tensorwire/internal/backoff"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Methods marks a service's methods repeatable: true for one that may be
// sent again after its request may have reached the node, because doing
// it twice does what doing it once does (a read; a write the node
// recognises by an id the request carries; a grant that expires with its
// lease, as etcd's LeaseGrant). A method not marked is sent again only
// when its request surely never left (the dial failed), as etcd's
// isSafeRetryMutableRPC allows.
type Methods map[string]bool

// Backoff returns the retry policy's waits: full jitter, the bound 20 ms
// doubling to 1 s (internal/backoff). Many clients of a node that
// restarts come back spread out, not in lock-step.
func Backoff() backoff.Backoff {
	return backoff.Backoff{Base: 20 * time.Millisecond, Max: time.Second}
}

// Caller is a service client's side of the retry policy: its connection,
// its methods' marks, and how it says it was closed.
type Caller struct {
	RPC     *rpc.Client
	Methods Methods
	// Closed reports whether the client was closed: calls fail with
	// ErrClosed from then on, and a call that fails once it was does too
	// (Close cut it).
	Closed    func() bool
	ErrClosed error
}

// Call is rpc.Call of c's node, tried again as Retry says; with into,
// rpc.CallInto (each attempt reads into the same TensorDicts).
func Call[Resp, Req any](ctx context.Context, c *Caller, method string, req Req, into ...*tensordict.TensorDict) (Resp, error) {
	var resp Resp
	err := c.Retry(ctx, method, func() (err error) {
		resp, err = rpc.CallInto[Resp](ctx, c.RPC, method, req, into...)
		return err
	})
	return resp, err
}

// Retry runs attempt, a call of method (or a few steps around one), until
// it succeeds, fails in a way Retryable refuses, or ctx ends, waiting
// between attempts as Backoff says. It returns c.ErrClosed once c is
// closed, and ctx's error wrapping the last one when ctx ended while the
// node was unreachable.
func (c *Caller) Retry(ctx context.Context, method string, attempt func() error) error {
	wait := Backoff()
	var unreachable error // the last attempt's error when it found the node unreachable
	for {
		if c.Closed() {
			return c.ErrClosed
		}
		err := attempt()
		if err == nil {
			return nil
		}
		if c.Closed() || errors.Is(err, rpc.ErrClosed) {
			return c.ErrClosed
		}
		if !c.Retryable(method, err) {
			if unreachable != nil && ctx.Err() != nil {
				// ctx ended during an attempt rather than between two:
				// the node was unreachable all the same.
				return fmt.Errorf("%w; the node was unreachable: %w", err, unreachable)
			}
			return err
		}
		unreachable = err
		if werr := wait.Wait(ctx); werr != nil {
			return fmt.Errorf("%w; the node was unreachable: %w", werr, err)
		}
	}
}

// Retryable reports whether a call of method that failed with err may be
// sent again: err is Unavailable (the node unreachable, or the connection
// broken), and the method is repeatable or the request never left.
// Nothing else is retried: the node's own errors are its answer.
func (c *Caller) Retryable(method string, err error) bool {
	if !errors.Is(err, rpc.ErrUnavailable) || errors.Is(err, rpc.ErrClosed) {
		return false
	}
	return c.Methods[method] || NotSent(err)
}

// NotSent reports whether err shows that the call's request never left
// this side: the connection to the node could not be dialed.
func NotSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}
