package serve

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// The attached replicas of attach.go and replica.go, from Go: a replica
// here is a serve.replica stream opened by the test, which answers (or
// does not) as each test says. python/tests/test_replica.py runs the same
// with torch modules in Python processes, killed and stopped.

// goReplica is an attached replica run by a test: it answers each batch
// with a testModel's outputs and the given version, after act, which may
// stop it (return false: the stream is closed without an answer).
type goReplica struct {
	st   *rpc.Stream[replicaAnswer, replicaBatch]
	got  chan int // the rows of each batch received
	done chan error
	fail string // answer every batch with this error, when set before the first
}

func attachReplica(t *testing.T, addr string, version uint64, act func(n int) bool) *goReplica {
	t.Helper()
	return attachReplicaWindow(t, addr, version, 0, act)
}

// openReplica opens a serve.replica stream to the node at addr under ctx,
// asking for window batches in flight (0: a replica from before windows,
// which sends none), over a client of opts: the test answers on it as an
// attached replica would, or does not. The client and the stream close
// when the test ends.
func openReplica(ctx context.Context, t *testing.T, addr string, window int, opts ...rpc.Option) *rpc.Stream[replicaAnswer, replicaBatch] {
	t.Helper()
	c, err := rpc.Dial(ctxT(t), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	st, err := rpc.OpenStream[replicaAnswer, replicaBatch](ctx, c, MethodReplica, replicaRequest{Name: "model", Window: window})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// attachReplicaWindow is attachReplica asking for window batches in
// flight (openReplica).
func attachReplicaWindow(t *testing.T, addr string, version uint64, window int, act func(n int) bool) *goReplica {
	t.Helper()
	st := openReplica(context.Background(), t, addr, window)
	r := &goReplica{st: st, got: make(chan int, 16), done: make(chan error, 1)}
	model := &testModel{b: &behaviour{}}
	go func() {
		for {
			b, err := st.Recv(context.Background())
			if err != nil {
				r.done <- err
				return
			}
			r.got <- b.N
			if act != nil && !act(b.N) {
				st.Close()
				r.done <- nil
				return
			}
			out, err := model.Forward(context.Background(), b.In.TensorDict)
			ans := replicaAnswer{Batch: b.Batch, Version: version}
			switch {
			case r.fail != "":
				ans.Error = r.fail
			case err != nil:
				ans.Error = err.Error()
			default:
				ans.Out = &rpc.TD{TensorDict: out}
			}
			if err := st.Send(context.Background(), ans); err != nil {
				r.done <- err
				return
			}
		}
	}()
	return r
}

// wantAnswer waits for call, of rowsOf(t, id, n), and fails t (what
// naming the call) unless its answer is those rows' outputs by parameter
// version v: the replica of that version ran it.
func wantAnswer(t *testing.T, what string, call *Call, id, n int, v uint64) {
	t.Helper()
	out, got, err := call.Wait()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if _, err := checkOutputs(out, id, n, 0); err != nil || got != v {
		t.Fatalf("%s: version %d (want %d), %v", what, got, v, err)
	}
}

func attachedConfig(maxBatch int) Config {
	cfg := testConfig(&behaviour{}, maxBatch)
	cfg.New, cfg.AttachedOnly = nil, true
	return cfg
}

// waitAttached waits until the manager counts n attached replicas.
func waitAttached(t *testing.T, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for m.Stats().AttachedNow != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d replicas attached, want %d", m.Stats().AttachedNow, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAttach_Predicts(t *testing.T) {
	n := serveModel(t, "", attachedConfig(8))
	attachReplica(t, n.addr, 7, nil)
	waitAttached(t, n.m, 1)
	c := dial(t, n.addr, "", "bytes")
	out, v, err := c.Predict(ctxT(t), rowsOf(t, 5, 3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkOutputs(out, 5, 3, 0); err != nil || v != 7 {
		t.Fatalf("version %d (want the replica's, 7), %v", v, err)
	}
	if _, err := n.m.Load(ctxT(t), params(t, 1)); !errors.Is(err, ErrConfig) {
		t.Fatalf("Load on a manager of attached replicas only: %v, want ErrConfig", err)
	}
}

func TestAttach_GoneMidBatch(t *testing.T) {
	t.Run("another replica runs it", func(t *testing.T) {
		n := serveModel(t, "", attachedConfig(8))
		release := make(chan struct{})
		a := attachReplica(t, n.addr, 1, func(int) bool { <-release; return false })
		waitAttached(t, n.m, 1)
		c := dial(t, n.addr, "", "bytes")
		call := c.Go(ctxT(t), rowsOf(t, 5, 3))
		<-a.got // A holds the batch
		attachReplica(t, n.addr, 2, nil)
		waitAttached(t, n.m, 2)
		close(release) // A closes its stream without answering
		wantAnswer(t, "the batch A held, run by B", call, 5, 3, 2)
	})
	t.Run("one attaching meanwhile runs it", func(t *testing.T) {
		// The only replica goes away holding the batch, and another
		// attaches only after it was detached (a replica restarting):
		// the batch waits for it, as a request waits Config.AttachWait.
		n := serveModel(t, "", attachedConfig(8))
		release := make(chan struct{})
		a := attachReplica(t, n.addr, 1, func(int) bool { <-release; return false })
		waitAttached(t, n.m, 1)
		c := dial(t, n.addr, "", "bytes")
		call := c.Go(ctxT(t), rowsOf(t, 5, 3))
		<-a.got
		close(release)
		waitAttached(t, n.m, 0)
		attachReplica(t, n.addr, 2, nil)
		wantAnswer(t, "the batch A held, run by B attached after A left", call, 5, 3, 2)
	})
	t.Run("none left", func(t *testing.T) {
		cfg := attachedConfig(8)
		cfg.AttachWait = 300 * time.Millisecond
		n := serveModel(t, "", cfg)
		attachReplica(t, n.addr, 1, func(int) bool { return false })
		waitAttached(t, n.m, 1)
		c := dial(t, n.addr, "", "bytes")
		start := time.Now()
		_, _, err := c.Predict(ctxT(t), rowsOf(t, 5, 3))
		if !errors.Is(err, ErrForward) || !strings.Contains(err.Error(), "went away") {
			t.Fatalf("%v, want ErrForward saying the replica went away", err)
		}
		if took := time.Since(start); took < cfg.AttachWait {
			t.Fatalf("failed after %v, before AttachWait (%v) passed", took, cfg.AttachWait)
		}
	})
}

func TestAttach_SilentReplicaIsDetached(t *testing.T) {
	cfg := attachedConfig(8)
	cfg.ReplicaTimeout = 200 * time.Millisecond
	n := serveModel(t, "", cfg)
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	a := attachReplica(t, n.addr, 1, func(int) bool { <-hold; return false })
	waitAttached(t, n.m, 1)
	c := dial(t, n.addr, "", "bytes")
	call := c.Go(ctxT(t), rowsOf(t, 1, 2))
	<-a.got
	attachReplica(t, n.addr, 2, nil)
	wantAnswer(t, "the batch A held, run by B", call, 1, 2, 2)
	waitAttached(t, n.m, 1)
	if st := n.m.Stats(); st.Detached != 1 {
		t.Fatalf("detached %d, want 1", st.Detached)
	}
}

func TestAttach_ErrorFailsTheBatch(t *testing.T) {
	n := serveModel(t, "", attachedConfig(8))
	r := attachReplica(t, n.addr, 1, func(int) bool { return true })
	r.fail = "ValueError: boom"
	waitAttached(t, n.m, 1)
	c := dial(t, n.addr, "", "bytes")
	_, _, err := c.Predict(ctxT(t), rowsOf(t, 1, 2))
	if !errors.Is(err, ErrForward) || !strings.Contains(err.Error(), "ValueError: boom") {
		t.Fatalf("%v, want ErrForward with the replica's message", err)
	}
	// The node ended the stream with that error and detached it.
	if err := <-r.done; !errors.Is(err, ErrForward) {
		t.Fatalf("the replica's stream ended with %v, want ErrForward", err)
	}
	waitAttached(t, n.m, 0)
}

func TestAttach_NoReplica(t *testing.T) {
	cfg := attachedConfig(4)
	cfg.AttachWait = 200 * time.Millisecond
	n := serveModel(t, "", cfg)
	c := dial(t, n.addr, "", "bytes")
	errs := make(chan error, 3)
	for i := range 3 { // 3 requests of 3 rows: one in the open batch, two behind it
		go func() {
			_, _, err := c.Predict(ctxT(t), rowsOf(t, i, 3))
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, ErrNoReplica) || !errors.Is(err, rpc.ErrFailedPrecondition) {
			t.Fatalf("%v, want ErrNoReplica (FailedPrecondition)", err)
		}
	}
	attachReplica(t, n.addr, 3, nil)
	if _, v, err := c.Predict(ctxT(t), rowsOf(t, 1, 1)); err != nil || v != 3 {
		t.Fatalf("with a replica attached: version %d, %v", v, err)
	}
}

// TestAttach_OutputsByReferenceRefused: a replica sharing the node's root
// that sends its outputs as a TD by reference (valid only until the
// node's next read) fails its batch with ErrForward and is detached; the
// node reads no mapping after it.
func TestAttach_OutputsByReferenceRefused(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, attachedConfig(8))
	st := openReplica(context.Background(), t, n.addr, 0, rpc.WithRoot(root))
	go func() {
		b, err := st.Recv(context.Background())
		if err != nil {
			return
		}
		out, err := testOut.Create(filepath.Join(root, "outs"), b.N)
		if err != nil {
			return
		}
		defer out.Close()
		st.Send(context.Background(), replicaAnswer{Batch: b.Batch, Version: 1, Out: &rpc.TD{TensorDict: out}})
		st.Recv(context.Background()) // until the node ends the stream
	}()
	waitAttached(t, n.m, 1)
	cl := dial(t, n.addr, "", "bytes")
	_, _, err := cl.Predict(ctxT(t), rowsOf(t, 1, 2))
	if !errors.Is(err, ErrForward) || !strings.Contains(err.Error(), "by reference") {
		t.Fatalf("%v, want ErrForward about outputs by reference", err)
	}
	waitAttached(t, n.m, 0)
}
