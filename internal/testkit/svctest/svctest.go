// Package svctest is what the tests of the services on rpc (replay,
// store, serve, loader) share: serving one object from a helper process
// (ServeHelper), the check that a package's sentinel errors cross the
// wire by code and reason (CrossTheWire), and the check of a config's
// errors (WantConfigError).
//
// It is apart from internal/testkit/proctest because it imports rpc, whose own
// tests use proctest.
package svctest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// Adder is a service that serves objects of type T under names: each
// service's *Service and its Add (replay's buffers, store's stores,
// serve's managers, loader's producers).
type Adder[T any] interface {
	Add(name string, x T) error
}

// ServeHelper is the body of a helper process that is a node: it makes an
// rpc.Server with root as its root (rpc.WithRoot: clients under root share
// its filesystem), registers a service on it with register (the package's
// Register), adds x to the service under name and serves it on addr as
// proctest.Serve does (any loopback port if addr is "", "ADDR host:port"
// printed). It returns only on an error; the process serves until killed.
func ServeHelper[S Adder[T], T any](root, addr string, register func(*rpc.Server) (S, error), name string, x T) error {
	s, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		return err
	}
	svc, err := register(s)
	if err != nil {
		return err
	}
	if err := svc.Add(name, x); err != nil {
		return err
	}
	return proctest.Serve(addr, s.Serve)
}

// Sentinel is one row of a package's table of sentinel errors: the error,
// the rpc sentinel of the code it crosses the wire with (rpc.ErrNotFound
// for code NotFound) and its reason, which is part of the protocol.
type Sentinel struct {
	Err    error
	Code   error
	Reason string
}

// failMethod is the method CrossTheWire's server fails with.
const failMethod = "svctest.fail"

type failRequest struct {
	I int `codec:"i"`
}

// CrossTheWire has a handler on a server of its own, on loopback, return
// each sentinel wrapped in a message that does not begin with the
// sentinel's text, and checks, in a subtest named by the sentinel's text,
// that the caller's error matches (errors.Is) the sentinel and its code,
// carries the reason (an *rpc.Error whose Reason is it), and matches no
// other sentinel of the table. The server and client are closed when t
// ends.
func CrossTheWire(t *testing.T, sentinels []Sentinel) {
	t.Helper()
	s, err := rpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	err = rpc.Register(s, failMethod, func(_ context.Context, req failRequest) (rpc.Empty, error) {
		return rpc.Empty{}, fmt.Errorf("reworded, the sentinel's text last: %w", sentinels[req.I].Err)
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
	for i, w := range sentinels {
		t.Run(w.Err.Error(), func(t *testing.T) {
			_, err := rpc.Call[rpc.Empty](ctx, c, failMethod, failRequest{I: i})
			if !errors.Is(err, w.Err) || !errors.Is(err, w.Code) {
				t.Fatalf("%v: want it to match %v and %v", err, w.Err, w.Code)
			}
			if re, ok := errors.AsType[*rpc.Error](err); !ok || re.Reason != w.Reason {
				t.Fatalf("%#v: want the reason %q", err, w.Reason)
			}
			for _, other := range sentinels {
				if other.Err != w.Err && errors.Is(err, other.Err) {
					t.Errorf("%v also matches %v", err, other.Err)
				}
			}
		})
	}
}

// Poll calls cond every millisecond until it is true, failing t (with
// what) when it is not within d.
func Poll(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
	}
}
