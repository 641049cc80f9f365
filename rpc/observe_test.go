package rpc

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// observations is an Observer that hands each Observation to the test.
type observations chan Observation

func (o observations) Observe(ob Observation) { o <- ob }

// next returns the next observation, failing the test after 10 s: a call's
// is made after its answer is written, so it may come after Call returns.
func (o observations) next(t *testing.T) Observation {
	t.Helper()
	select {
	case ob := <-o:
		return ob
	case <-time.After(10 * time.Second):
		t.Fatal("no observation")
		return Observation{}
	}
}

type namedRequest struct {
	Name string `codec:"name"`
}

// TestObserver_Calls checks what a Server tells its Observer of calls: by
// reference, by bytes, a handler's error, a method the node does not have.
func TestObserver_Calls(t *testing.T) {
	root := t.TempDir()
	obs := make(observations, 16)
	s, addr := startServer(t, WithRoot(root), WithObserver(obs))
	if err := Register(s, "test.missing", func(_ context.Context, req namedRequest) (Empty, error) {
		return Empty{}, Errorf(NotFound, "no %q", req.Name)
	}); err != nil {
		t.Fatal(err)
	}
	td := seedTD(t, filepath.Join(root, "td"), 100) // 48 bytes a row
	ctx := context.Background()

	ref := dial(t, addr, WithRoot(root))
	if err := ref.Fill(ctx, td, []int{0, 1, 2}, 1); err != nil {
		t.Fatal(err)
	}
	ob := obs.next(t)
	if ob.Method != MethodFill || ob.Code != OK || ob.Stream || ob.RefBytesIn != 3*48 || ob.BytesIn != 0 || ob.BytesOut != 0 || ob.Duration <= 0 {
		t.Errorf("fill by reference: %+v; want %s, OK, 144 bytes by reference, none by value", ob, MethodFill)
	}
	if _, ok := ob.Request.(*FillRequest); !ok {
		t.Errorf("fill's Request is a %T, want *FillRequest", ob.Request)
	}

	bytes := dial(t, addr)
	if err := bytes.Fill(ctx, td, []int{0, 1, 2}, 1); err != nil {
		t.Fatal(err)
	}
	if ob := obs.next(t); ob.Method != MethodFill || ob.Code != OK || ob.RefBytesIn != 0 || ob.BytesIn < 3*48 || ob.BytesOut < 3*48 {
		t.Errorf("fill by bytes: %+v; want the rows in and back by value", ob)
	}

	if _, err := Call[Empty](ctx, bytes, "test.missing", namedRequest{Name: "buf"}); CodeOf(err) != NotFound {
		t.Fatalf("test.missing: %v", err)
	}
	ob = obs.next(t)
	if r, ok := ob.Request.(*namedRequest); ob.Method != "test.missing" || ob.Code != NotFound || !ok || r.Name != "buf" {
		t.Errorf("a handler's error: %+v; want test.missing, NotFound, the request named buf", ob)
	}

	if _, err := Call[Empty](ctx, bytes, "no.such.method", Empty{}); CodeOf(err) != Unimplemented {
		t.Fatalf("no.such.method: %v", err)
	}
	if ob := obs.next(t); ob.Method != "" || ob.Code != Unimplemented || ob.Request != nil {
		t.Errorf("an unknown method: %+v; want no method named, Unimplemented, no request", ob)
	}
}

// TestObserver_Stream checks that a message stream is observed once, when
// it ends, with its opening request and its whole life.
func TestObserver_Stream(t *testing.T) {
	obs := make(observations, 4)
	s, addr := startServer(t, WithObserver(obs))
	if err := RegisterStream(s, "test.count", func(ctx context.Context, req namedRequest, st *ServerStream[int, int]) error {
		for {
			n, err := st.Recv(ctx)
			if err != nil {
				return nil // io.EOF: the caller is done
			}
			if err := st.Send(ctx, n+1); err != nil {
				return err
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, addr)
	ctx := context.Background()
	st, err := OpenStream[int, int](ctx, c, "test.count", namedRequest{Name: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := st.Send(ctx, i); err != nil {
			t.Fatal(err)
		}
		if n, err := st.Recv(ctx); err != nil || n != i+1 {
			t.Fatalf("Recv = %d, %v", n, err)
		}
	}
	if err := st.CloseSend(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(ctx); err == nil {
		t.Fatal("Recv after the handler's end: no error")
	}
	st.Close()
	ob := obs.next(t)
	if r, ok := ob.Request.(*namedRequest); ob.Method != "test.count" || !ob.Stream || ob.Code != OK || !ok || r.Name != "counter" {
		t.Errorf("stream: %+v; want test.count, a stream, OK, the request named counter", ob)
	}
}
