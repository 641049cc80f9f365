package serve

// Tests with clients and nodes in other processes, killed with SIGKILL.
// The other process is this test binary run again (proctest);
// TENSORWIRE_SERVE_HELPER says what it is.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

const (
	envHelper = "TENSORWIRE_SERVE_HELPER" // "node" or "client"
	envAddr   = "TENSORWIRE_SERVE_ADDR"   // node: where to listen; client: the node
	envRoot   = "TENSORWIRE_SERVE_ROOT"   // the shared root
)

// TestHelperProcess is not a test: it is the body of the helper processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	proctest.RunHelper(t, envHelper, map[string]func() error{
		"node":   helperNode,
		"client": func() error { return helperClient(t) },
	})
}

// The codes a row's first element holds to make procModel misbehave, for
// the batch it is in.
const (
	codeError = -1 // Forward returns an error
	codePanic = -2 // Forward panics
	codeGate  = -3 // Forward waits for the file "gate" under the root
)

// procModel is the test model, misbehaving as its input rows ask.
type procModel struct {
	testModel
	gate string // the gate file
}

func (m *procModel) Forward(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	x, _ := in.Tensor("x")
	xs, err := tensordict.Values[float32](x)
	if err != nil {
		return nil, err
	}
	for i := 0; i < len(xs); i += 4 {
		switch xs[i] {
		case codeError:
			return nil, errors.New("injected failure")
		case codePanic:
			panic("injected panic")
		case codeGate:
			for {
				if _, err := os.Stat(m.gate); err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
		}
	}
	return m.testModel.Forward(ctx, in)
}

// procConfig is the configuration of procModel's managers: max batch 4,
// max queue 4, a lease of 300 ms.
func procConfig(root string) Config {
	b := &behaviour{}
	return Config{
		Input: testIn, Output: testOut, MaxBatch: 4, MaxQueue: 4, Lease: 300 * time.Millisecond,
		New: func(int) (Model, error) { return &procModel{testModel{b: b}, filepath.Join(root, "gate")}, nil },
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
}

// helperNode serves procModel as "model" on $ADDR (any port if unset),
// with $ROOT as its root, prints "ADDR host:port" and serves until killed.
func helperNode() error {
	root := os.Getenv(envRoot)
	m, err := New(procConfig(root))
	if err != nil {
		return err
	}
	return svctest.ServeHelper(root, os.Getenv(envAddr), Register, "model", m)
}

// helperClient dials the model at $ADDR by reference, prints "DIR" and its
// folder, sends a request of one row that holds the gate code and waits to
// be killed.
func helperClient(t *testing.T) error {
	ctx := context.Background()
	c, err := Dial(ctx, os.Getenv(envAddr), "model", WithRoot(os.Getenv(envRoot)))
	if err != nil {
		return err
	}
	if c.Mode() != "ref" {
		return fmt.Errorf("mode %s", c.Mode())
	}
	fmt.Println("DIR", c.dir)
	in := rowsOf(t, 0, 1)
	in.Fill([]int{0}, codeGate)
	_, _, err = c.Predict(ctx, in)
	return fmt.Errorf("the prediction returned: %w", err)
}

// gated returns one input row holding code.
func coded(t *testing.T, code float32) *tensordict.TensorDict {
	in := rowsOf(t, 0, 1)
	in.Fill([]int{0}, float64(code))
	return in
}

// TestProcess_ClientKilledMidRequest kills a client whose request is in
// the open batch: the batch runs for the other client in it, the dead
// client's registration ends with its lease and its folder is removed.
func TestProcess_ClientKilledMidRequest(t *testing.T) {
	root := t.TempDir()
	b := &behaviour{}
	cfg := testConfig(b, 4)
	cfg.Lease = 300 * time.Millisecond
	b.gate = make(chan struct{})
	b.started = make(chan int, 10)
	n := serveModel(t, root, cfg)
	c := dial(t, n.addr, root, "ref")
	first := c.Go(ctxT(t), rowsOf(t, 0, 1))
	select { // the replica is busy with it
	case <-b.started:
	case <-time.After(time.Minute):
		t.Fatal("the first request did not reach the replica in a minute")
	}

	helper := proctest.Start(t, envHelper+"=client", envAddr+"="+n.addr, envRoot+"="+root)
	dir := helper.Expect(t, "DIR")
	poll(t, "the dead-to-be client's row to join the open batch", func() bool { return n.m.Stats().Queued == 1 })
	second := c.Go(ctxT(t), rowsOf(t, 50, 1))
	poll(t, "our row to join it", func() bool { return n.m.Stats().Queued == 2 })
	helper.Kill()
	t.Logf("client killed with a request in the open batch; its folder %s", dir)
	close(b.gate)

	for i, call := range []*Call{first, second} {
		out, _, err := call.Wait()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		size, err := checkOutputs(out, 50*i, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && size != 2 {
			t.Errorf("our second row ran in a batch of %d, want 2 (with the dead client's)", size)
		}
	}
	poll(t, "the dead client's lease to run out and its folder to go", func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	})
	st, err := c.Stats(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Clients != 1 || st.Failed != 0 {
		t.Errorf("stats %+v: want our client alone, no failed batch", st)
	}
	if _, err := os.Stat(c.dir); err != nil {
		t.Errorf("our folder: %v", err)
	}
}

// startNode starts the helper node on addr ("" for any port) and returns
// it and its address.
func startNode(t *testing.T, root, addr string) (*proctest.Proc, string) {
	t.Helper()
	return proctest.StartServer(t, envHelper+"=node", envAddr+"="+addr, envRoot+"="+root)
}

// TestProcess_FailuresReachTheClient runs the node in its own process: a
// Forward that errors or panics, a request of the wrong schema, a full
// queue, each reach the client with its code, and the node serves on.
func TestProcess_FailuresReachTheClient(t *testing.T) {
	root := t.TempDir()
	_, addr := startNode(t, root, "")
	c := dial(t, addr, root, "ref", WithSlots(8))
	ctx := ctxT(t)

	for _, tc := range []struct {
		code float32
		msg  string
	}{{codeError, "injected failure"}, {codePanic, "injected panic"}} {
		_, _, err := c.Predict(ctx, coded(t, tc.code))
		if !errors.Is(err, ErrForward) || !errors.Is(err, rpc.ErrInternal) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("code %v: %v, want ErrForward (Internal) saying %q", tc.code, err, tc.msg)
		}
		out, _, err := c.Predict(ctx, rowsOf(t, 3, 2))
		if err != nil {
			t.Fatalf("after code %v: %v", tc.code, err)
		}
		if _, err := checkOutputs(out, 3, 2, 0); err != nil {
			t.Error(err)
		}
	}

	rc, err := rpc.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	wrong := rowsOf(t, 0, 1)
	wrong.Delete("x")
	x, _ := tensordict.FromSlice(make([]float32, 3), 1, 3)
	wrong.Set("x", x)
	if _, err := rpc.Call[predictResponse](ctx, rc, MethodPredict, predictRequest{Name: "model", N: 1, In: &rpc.TD{TensorDict: wrong}}); !errors.Is(err, ErrSchema) || !errors.Is(err, rpc.ErrInvalidArgument) {
		t.Errorf("wrong schema: %v, want ErrSchema (InvalidArgument)", err)
	}

	// The replica waits on the gate; 4 rows fill the queue; the next is
	// refused.
	gated := c.Go(ctx, coded(t, codeGate))
	stats := func() Stats {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	base := stats().Batches
	// One snapshot: the gated request queued (Requests) and taken (Queued
	// 0) at once. Two calls could see Queued 0 before it came and
	// Requests 5 after, with it still in the open batch, where the next
	// request would join it and the queue never reach 4 rows.
	poll(t, "the gated batch to start", func() bool { st := stats(); return st.Queued == 0 && st.Requests >= 5 })
	var queued []*Call
	for i := range 2 {
		queued = append(queued, c.Go(ctx, rowsOf(t, 10*i, 2)))
	}
	poll(t, "4 rows queued", func() bool { return stats().Queued == 4 })
	_, _, err = c.Predict(ctx, rowsOf(t, 0, 1))
	if !errors.Is(err, ErrQueueFull) || !errors.Is(err, rpc.ErrResourceExhausted) {
		t.Errorf("full queue: %v, want ErrQueueFull (ResourceExhausted)", err)
	}
	if err := os.WriteFile(filepath.Join(root, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := gated.Wait(); err != nil {
		t.Error(err)
	}
	for i, call := range queued {
		out, _, err := call.Wait()
		if err == nil {
			_, err = checkOutputs(out, 10*i, 2, 0)
		}
		if err != nil {
			t.Error(err)
		}
	}
	if st := stats(); st.QueueFull != 1 || st.Batches < base+2 {
		t.Errorf("stats %+v", st)
	}
}

// TestProcess_NodeKilledAndRestarted kills the node (SIGKILL) under
// clients predicting in a loop, in both modes, and starts it again on the
// same address: the clients carry on by themselves (the one by reference
// registers its slots again), and no call fails.
func TestProcess_NodeKilledAndRestarted(t *testing.T) {
	root := t.TempDir()
	node, addr := startNode(t, root, "")
	ctx := ctxT(t)
	clients := map[string]*Client{}
	for _, mode := range []string{"ref", "bytes"} {
		clients[mode] = dial(t, addr, root, mode, WithSlots(8))
	}
	firstID := clients["ref"].id
	var done atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for mode, c := range clients {
		for w := range 2 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					id, n := 100*w+i%50, 1+i%2
					var out *tensordict.TensorDict
					var err error
					for try := true; try; try = errors.Is(err, ErrQueueFull) {
						// The queue holds 4 rows, fewer than the workers
						// may send at once: back off when it is full.
						if err != nil {
							time.Sleep(time.Millisecond)
						}
						if w == 0 {
							out, _, err = c.Predict(ctx, rowsOf(t, id, n))
							continue
						}
						// PredictInto on this worker's own rows.
						start := 6 // Predict takes rows from 0: these are apart
						if err = c.Input().SetSlice(start, rowsOf(t, id, n)); err == nil {
							if _, err = c.PredictInto(ctx, start, n); err == nil {
								out, err = c.Output().Slice(start, start+n)
							}
						}
					}
					if err == nil {
						_, err = checkOutputs(out, id, n, 0)
					}
					if err != nil {
						errs <- fmt.Errorf("%s worker %d: %w", mode, w, err)
						return
					}
					done.Add(1)
				}
			})
		}
	}
	waitFor := func(n int64) {
		floor := done.Load()
		poll(t, fmt.Sprintf("%d more predictions", n), func() bool { return done.Load() >= floor+n || len(errs) > 0 })
	}
	waitFor(50)
	for round := range 2 {
		node.Kill()
		t.Logf("round %d: node killed after %d predictions", round, done.Load())
		node, _ = startNode(t, root, addr)
		waitFor(50)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if clients["ref"].id == firstID {
		t.Error("the client by reference did not register again")
	}
	st, err := clients["ref"].Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Clients != 1 {
		t.Errorf("%d clients registered with the new node, want 1", st.Clients)
	}
	if !slices.ContainsFunc(st.Sizes, func(n uint64) bool { return n > 0 }) {
		t.Errorf("stats %+v", st)
	}
}

// TestProcess_CallEndedWhileNodeDownFreesItsSlots: a Predict by bell whose
// context ends while the node is dead keeps its slots until the node
// answers it; the node never will, and its successor drops the request.
// Once the client has registered with the new node and sees the old one's
// lock free, it gives the slots back (before, it kept them for quietWait,
// 30 s: every later call wanting them waited, and failed by its
// deadline; found by faulttest's TestServeAcrossHosts). quietWait is made
// far longer than the test's context here, so that only the fix frees them.
func TestProcess_CallEndedWhileNodeDownFreesItsSlots(t *testing.T) {
	root := t.TempDir()
	node, addr := startNode(t, root, "")
	c := bellClient(t, addr, root, WithSlots(4))
	c.quiet = time.Hour
	if _, _, err := c.Predict(ctxT(t), rowsOf(t, 0, 4)); err != nil {
		t.Fatal(err)
	}
	node.Kill()
	ctx, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
	_, _, err := c.Predict(ctx, rowsOf(t, 1, 4)) // every slot, rung on the dead node's bell
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Predict with the node dead: %v, want its deadline", err)
	}
	startNode(t, root, addr)
	out, _, err := c.Predict(ctxT(t), rowsOf(t, 2, 4))
	if err != nil {
		t.Fatalf("Predict after the node came back: %v", err)
	}
	if _, err := checkOutputs(out, 2, 4, 0); err != nil {
		t.Fatal(err)
	}
}
