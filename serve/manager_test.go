package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The test model: input {"x": float32[4]}, output {"y": float32[2]} with
// y[0] = sum(x) + bias and y[1] = the batch's rows, so a test sees both the
// computation and the batch a row was in. Its parameters are {"bias":
// float32[1]}.
var (
	testIn  = tensordict.RowSchema{{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{4}}}
	testOut = tensordict.RowSchema{{Key: []string{"y"}, DType: memmap.Float32, Shape: []int{2}}}
)

// behaviour is what the test models of one manager share: a gate Forward
// waits on, and failures to inject.
type behaviour struct {
	gate    chan struct{}     // Forward receives from it first, when not nil
	started chan int          // Forward sends its batch size, when not nil
	fail    atomic.Int32      // the next Forward calls that fail: 1 error, 2 panic
	built   atomic.Int32      // models made
	alias   bool              // return the input buffer
	mu      sync.Mutex        //
	loads   []float32         // biases loaded, in order
	forward func(n int) error // called by Forward, when set
}

type testModel struct {
	b    *behaviour
	bias float32
}

func (m *testModel) Forward(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	n := in.BatchSize()[0]
	if m.b.started != nil {
		m.b.started <- n
	}
	if m.b.gate != nil {
		select {
		case <-m.b.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	switch m.b.fail.Swap(0) {
	case 1:
		return nil, errors.New("injected failure")
	case 2:
		panic("injected panic")
	}
	if m.b.forward != nil {
		if err := m.b.forward(n); err != nil {
			return nil, err
		}
	}
	x, err := in.Tensor("x")
	if err != nil {
		return nil, err
	}
	xs, err := tensordict.Values[float32](x)
	if err != nil {
		return nil, err
	}
	ys := make([]float32, 2*n)
	for i := range n {
		for _, v := range xs[4*i : 4*i+4] {
			ys[2*i] += v
		}
		ys[2*i] += m.bias
		ys[2*i+1] = float32(n)
	}
	if m.b.alias {
		// Write the outputs over the input buffer and return views of it.
		buf, _ := x.Bytes()
		y, err := tensordict.FromBytes(memmap.Float32, []int{n, 2}, buf[:8*n])
		if err != nil {
			return nil, err
		}
		copy(buf, f32bytes(ys))
		out, _ := tensordict.New(n)
		return out, out.Set("y", y)
	}
	y, err := tensordict.FromSlice(ys, n, 2)
	if err != nil {
		return nil, err
	}
	out, _ := tensordict.New(n)
	return out, out.Set("y", y)
}

func (m *testModel) Load(_ context.Context, params *tensordict.TensorDict) error {
	t, err := params.Tensor("bias")
	if err != nil {
		return err
	}
	if t.DType() != memmap.Float32 || !slices.Equal(t.Shape(), []int{1}) {
		return fmt.Errorf("bias of %v %v", t.DType(), t.Shape())
	}
	v, err := tensordict.Values[float32](t)
	if err != nil {
		return err
	}
	m.bias = v[0]
	m.b.mu.Lock()
	m.b.loads = append(m.b.loads, v[0])
	m.b.mu.Unlock()
	return nil
}

func f32bytes(v []float32) []byte {
	t, _ := tensordict.FromSlice(v, len(v))
	b, _ := t.Bytes()
	return b
}

// plainModel is a Model that is not a Loader.
type plainModel struct{ m *testModel }

func (p *plainModel) Forward(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	return p.m.Forward(ctx, in)
}

func testConfig(b *behaviour, maxBatch int) Config {
	return Config{
		Input: testIn, Output: testOut, MaxBatch: maxBatch,
		New: func(int) (Model, error) { b.built.Add(1); return &testModel{b: b}, nil },
		Log: slog.New(slog.DiscardHandler),
	}
}

func newManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// rowsOf returns a batch of n input rows; row i holds id+i in every
// element, so its y[0] is 4*(id+i) + bias.
func rowsOf(t testing.TB, id, n int) *tensordict.TensorDict {
	t.Helper()
	xs := make([]float32, 4*n)
	for i := range xs {
		xs[i] = float32(id + i/4)
	}
	x, err := tensordict.FromSlice(xs, n, 4)
	if err != nil {
		t.Fatal(err)
	}
	td, _ := tensordict.New(n)
	if err := td.Set("x", x); err != nil {
		t.Fatal(err)
	}
	return td
}

// checkOutputs checks out against rowsOf(id, n) and bias, and returns the
// batch size each row was in.
func checkOutputs(out *tensordict.TensorDict, id, n int, bias float32) (int, error) {
	y, err := out.Tensor("y")
	if err != nil {
		return 0, err
	}
	ys, err := tensordict.Values[float32](y)
	if err != nil {
		return 0, err
	}
	if len(ys) != 2*n {
		return 0, fmt.Errorf("%d outputs for %d rows", len(ys), n)
	}
	for i := range n {
		if want := 4*float32(id+i) + bias; ys[2*i] != want {
			return 0, fmt.Errorf("row %d of request %d: y = %v, want %v", i, id, ys[2*i], want)
		}
	}
	return int(ys[1]), nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// poll waits up to 30 s for cond.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	svctest.Poll(t, 30*time.Second, what, cond)
}

func TestManager_Predict(t *testing.T) {
	m := newManager(t, testConfig(&behaviour{}, 8))
	for _, n := range []int{1, 3, 8} {
		out, v, err := m.Predict(ctxT(t), rowsOf(t, 10, n))
		if err != nil {
			t.Fatal(err)
		}
		if v != 0 {
			t.Errorf("version %d, want 0", v)
		}
		if _, err := checkOutputs(out, 10, n, 0); err != nil {
			t.Error(err)
		}
	}
	out, _ := testOut.Zeros(2)
	if _, err := m.PredictInto(ctxT(t), rowsOf(t, 5, 2), out); err != nil {
		t.Fatal(err)
	}
	if _, err := checkOutputs(out, 5, 2, 0); err != nil {
		t.Error(err)
	}
}

// startGated starts a manager whose one replica is held inside Forward by
// a first request of one row, and returns a release function.
func startGated(t *testing.T, cfg Config, b *behaviour) (m *Manager, first chan error, release func()) {
	t.Helper()
	b.gate = make(chan struct{})
	b.started = make(chan int, 100)
	m = newManager(t, cfg)
	first = make(chan error, 1)
	go func() {
		_, _, err := m.Predict(context.Background(), rowsOf(t, 0, 1))
		first <- err
	}()
	<-b.started
	var once sync.Once
	release = func() { once.Do(func() { close(b.gate) }) }
	t.Cleanup(release)
	return m, first, release
}

// TestManager_GreedyBatches queues requests while the replica is busy and
// checks the batches greedy makes of them: full ones, in order, the request
// that would overflow carried over whole.
func TestManager_GreedyBatches(t *testing.T) {
	tests := []struct {
		name    string
		sizes   []int // the requests, queued in this order
		batches []int // the batches after the first (of 1 row)
	}{
		{"singles", []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, []int{4, 4, 2}},
		{"carry over", []int{2, 3, 1}, []int{2, 4}},
		{"never split", []int{3, 3, 3}, []int{3, 3, 3}},
		{"full", []int{4, 1}, []int{4, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &behaviour{}
			m, first, release := startGated(t, testConfig(b, 4), b)
			var wg sync.WaitGroup
			errs := make(chan error, len(tt.sizes))
			queued := 0
			for i, n := range tt.sizes {
				queued += n
				wg.Go(func() {
					out, _, err := m.Predict(ctxT(t), rowsOf(t, 100*i, n))
					if err == nil {
						_, err = checkOutputs(out, 100*i, n, 0)
					}
					errs <- err
				})
				// One at a time, so that they queue in this order.
				poll(t, "the request to queue", func() bool { return m.Stats().Queued == queued })
			}
			release()
			wg.Wait()
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			var got []int
			for range tt.batches { // startGated took the first's
				got = append(got, <-b.started)
			}
			if !slices.Equal(got, tt.batches) {
				t.Errorf("batches %v after the first, want %v", got, tt.batches)
			}
		})
	}
}

// TestManager_MaxDelayWaitsForAFullBatch: with a long maximum delay a free
// replica waits until the batch is full, where greedy would run the first
// request alone.
func TestManager_MaxDelayWaitsForAFullBatch(t *testing.T) {
	b := &behaviour{started: make(chan int, 10)}
	cfg := testConfig(b, 4)
	cfg.Policy = MaxDelay(time.Hour)
	m := newManager(t, cfg)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			out, _, err := m.Predict(ctxT(t), rowsOf(t, i, 1))
			if err == nil {
				var n int
				n, err = checkOutputs(out, i, 1, 0)
				if err == nil && n != 4 {
					err = fmt.Errorf("a batch of %d rows, want 4", n)
				}
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if st := m.Stats(); st.Batches != 1 || st.Sizes[4] != 1 {
		t.Errorf("stats %+v: want one batch of 4", st)
	}
}

// TestManager_MaxDelayRunsALoneRequest: a request alone runs once the
// delay has passed.
func TestManager_MaxDelayRunsALoneRequest(t *testing.T) {
	cfg := testConfig(&behaviour{}, 4)
	cfg.Policy = MaxDelay(time.Millisecond)
	m := newManager(t, cfg)
	out, _, err := m.Predict(ctxT(t), rowsOf(t, 3, 1))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := checkOutputs(out, 3, 1, 0); err != nil || n != 1 {
		t.Fatalf("batch of %d, %v", n, err)
	}
}

// TestManager_QueueFull: requests beyond MaxQueue rows fail at once with
// ErrQueueFull; those queued complete.
func TestManager_QueueFull(t *testing.T) {
	b := &behaviour{}
	cfg := testConfig(b, 2)
	cfg.MaxQueue = 4
	m, first, release := startGated(t, cfg, b)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if _, _, err := m.Predict(ctxT(t), rowsOf(t, i, 1)); err != nil {
				t.Error(err)
			}
		})
	}
	poll(t, "4 rows queued", func() bool { return m.Stats().Queued == 4 })
	_, _, err := m.Predict(ctxT(t), rowsOf(t, 9, 1))
	if !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err %v, want ErrQueueFull", err)
	}
	release()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.QueueFull != 1 || st.Requests != 5 {
		t.Errorf("stats %+v", st)
	}
	if _, _, err := m.Predict(ctxT(t), rowsOf(t, 9, 1)); err != nil {
		t.Errorf("after the queue drained: %v", err)
	}
}

func TestManager_BadInput(t *testing.T) {
	m := newManager(t, testConfig(&behaviour{}, 4))
	f64, _ := tensordict.FromSlice(make([]float64, 4), 1, 4)
	wrongDType, _ := tensordict.New(1)
	wrongDType.Set("x", f64)
	f32x3, _ := tensordict.FromSlice(make([]float32, 3), 1, 3)
	wrongShape, _ := tensordict.New(1)
	wrongShape.Set("x", f32x3)
	extra := rowsOf(t, 0, 1)
	extra.Set("z", f32x3)
	twoDims, _ := tensordict.New(1, 1)
	x, _ := tensordict.FromSlice(make([]float32, 4), 1, 1, 4)
	twoDims.Set("x", x)
	empty, _ := tensordict.New(0)
	x0, _ := tensordict.Zeros(memmap.Float32, 0, 4)
	empty.Set("x", x0)
	for name, in := range map[string]*tensordict.TensorDict{
		"wrong dtype": wrongDType, "wrong shape": wrongShape, "extra key": extra,
		"more than the max batch": rowsOf(t, 0, 5), "two batch dims": twoDims, "no rows": empty, "nil": nil,
	} {
		if _, _, err := m.Predict(ctxT(t), in); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: err %v, want ErrSchema", name, err)
		}
	}
	if st := m.Stats(); st.Requests != 0 {
		t.Errorf("%d requests queued, want none", st.Requests)
	}
}

// TestManager_ForwardFails: a Forward that errors or panics fails its
// batch's requests with ErrForward, and the replica gets a new model.
func TestManager_ForwardFails(t *testing.T) {
	for _, mode := range []int32{1, 2} {
		b := &behaviour{}
		m := newManager(t, testConfig(b, 4))
		b.fail.Store(mode)
		_, _, err := m.Predict(ctxT(t), rowsOf(t, 1, 1))
		if !errors.Is(err, ErrForward) {
			t.Fatalf("mode %d: err %v, want ErrForward", mode, err)
		}
		poll(t, "the replacement", func() bool { return m.Stats().Replaced == 1 })
		if got := b.built.Load(); got != 2 {
			t.Errorf("%d models built, want 2", got)
		}
		out, _, err := m.Predict(ctxT(t), rowsOf(t, 1, 1))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checkOutputs(out, 1, 1, 0); err != nil {
			t.Error(err)
		}
	}
}

// TestManager_OutputsCheckedAndCopied: a model returning outputs of the
// wrong shape fails the batch; one returning views of its input buffer
// has them copied before the buffer is reused.
func TestManager_OutputsCheckedAndCopied(t *testing.T) {
	b := &behaviour{alias: true}
	m := newManager(t, testConfig(b, 4))
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			out, _, err := m.Predict(ctxT(t), rowsOf(t, i, 1))
			if err == nil {
				_, err = checkOutputs(out, i, 1, 0)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()

	wrong := &behaviour{}
	cfg := testConfig(wrong, 4)
	cfg.Output = tensordict.RowSchema{{Key: []string{"y"}, DType: memmap.Float32, Shape: []int{3}}}
	m2 := newManager(t, cfg)
	if _, _, err := m2.Predict(ctxT(t), rowsOf(t, 0, 1)); !errors.Is(err, ErrForward) {
		t.Errorf("err %v, want ErrForward", err)
	}
}

func params(t testing.TB, bias float32) *tensordict.TensorDict {
	t.Helper()
	x, _ := tensordict.FromSlice([]float32{bias}, 1)
	td, _ := tensordict.New()
	if err := td.Set("bias", x); err != nil {
		t.Fatal(err)
	}
	return td
}

func TestManager_Load(t *testing.T) {
	b := &behaviour{}
	cfg := testConfig(b, 4)
	cfg.Replicas = 2
	m := newManager(t, cfg)
	for want := uint64(1); want <= 3; want++ {
		v, err := m.Load(ctxT(t), params(t, float32(100*want)))
		if err != nil || v != want {
			t.Fatalf("Load: version %d, %v; want %d", v, err, want)
		}
		for range 4 {
			out, v, err := m.Predict(ctxT(t), rowsOf(t, 1, 1))
			if err != nil {
				t.Fatal(err)
			}
			if v != want {
				t.Errorf("version %d, want %d", v, want)
			}
			if _, err := checkOutputs(out, 1, 1, float32(100*want)); err != nil {
				t.Error(err)
			}
		}
	}
	if got := b.built.Load(); got != 3 {
		t.Errorf("%d models built, want 3 (two replicas and a spare)", got)
	}

	// Refused parameters change nothing.
	bad, _ := tensordict.New()
	if _, err := m.Load(ctxT(t), bad); !errors.Is(err, ErrParams) {
		t.Errorf("Load of bad parameters: %v, want ErrParams", err)
	}
	if err := m.LoadVersion(ctxT(t), 3, params(t, 1)); !errors.Is(err, ErrVersion) {
		t.Errorf("LoadVersion(3) at 3: %v, want ErrVersion", err)
	}
	out, v, err := m.Predict(ctxT(t), rowsOf(t, 1, 1))
	if err != nil || v != 3 {
		t.Fatalf("after refused loads: version %d, %v", v, err)
	}
	if _, err := checkOutputs(out, 1, 1, 300); err != nil {
		t.Error(err)
	}
	if err := m.LoadVersion(ctxT(t), 10, params(t, 1000)); err != nil {
		t.Fatal(err)
	}
	if _, v, _ := m.Predict(ctxT(t), rowsOf(t, 1, 1)); v != 10 {
		t.Errorf("version %d after LoadVersion(10)", v)
	}

	plain := &behaviour{}
	cfg = testConfig(plain, 4)
	cfg.New = func(int) (Model, error) { return &plainModel{&testModel{b: plain}}, nil }
	m2 := newManager(t, cfg)
	if _, err := m2.Load(ctxT(t), params(t, 1)); !errors.Is(err, ErrConfig) {
		t.Errorf("Load on models that are not Loaders: %v, want ErrConfig", err)
	}
}

// TestManager_LoadWhileServing loads versions while callers predict: every
// response's outputs were computed with the version it reports, and after
// Load returns no response reports an older one.
func TestManager_LoadWhileServing(t *testing.T) {
	b := &behaviour{}
	cfg := testConfig(b, 4)
	cfg.Replicas = 3
	m := newManager(t, cfg)
	ctx := ctxT(t)
	var loaded atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				floor := loaded.Load()
				id := 1000*w + i%1000
				out, v, err := m.Predict(ctx, rowsOf(t, id, 1+i%2))
				if err != nil {
					t.Error(err)
					return
				}
				if v < floor {
					t.Errorf("version %d after Load of %d returned", v, floor)
				}
				if _, err := checkOutputs(out, id, 1+i%2, float32(100*v)); err != nil {
					t.Errorf("version %d: %v", v, err)
					return
				}
			}
		})
	}
	for v := uint64(1); v <= 20; v++ {
		if err := m.LoadVersion(ctx, v, params(t, float32(100*v))); err != nil {
			t.Fatal(err)
		}
		loaded.Store(v)
	}
	close(stop)
	wg.Wait()
	if st := m.Stats(); st.Switches < 20 {
		t.Errorf("%d switches for 20 versions", st.Switches)
	}
}

func TestManager_Close(t *testing.T) {
	b := &behaviour{}
	m, first, release := startGated(t, testConfig(b, 2), b)
	errs := make(chan error, 5)
	for i := range 5 {
		go func() {
			_, _, err := m.Predict(ctxT(t), rowsOf(t, i, 1))
			errs <- err
		}()
	}
	poll(t, "5 rows queued", func() bool { return m.Stats().Queued == 5 })
	closed := make(chan error)
	go func() { closed <- m.Close() }()
	for range 5 {
		if err := <-errs; !errors.Is(err, ErrStopped) {
			t.Errorf("queued request: %v, want ErrStopped", err)
		}
	}
	release()
	<-first // ran, or stopped: either way it returned
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Predict(ctxT(t), rowsOf(t, 0, 1)); !errors.Is(err, ErrStopped) {
		t.Errorf("after Close: %v, want ErrStopped", err)
	}
}

// TestManager_CanceledWhileQueued: a request whose context ends while it
// waits behind the open batch leaves the queue.
func TestManager_CanceledWhileQueued(t *testing.T) {
	b := &behaviour{}
	m, first, release := startGated(t, testConfig(b, 2), b)
	var wg sync.WaitGroup
	for i := range 2 { // fill the open batch
		wg.Go(func() {
			if _, _, err := m.Predict(ctxT(t), rowsOf(t, i, 1)); err != nil {
				t.Error(err)
			}
		})
	}
	poll(t, "the open batch to fill", func() bool { return m.Stats().Queued == 2 })
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error)
	go func() {
		_, _, err := m.Predict(ctx, rowsOf(t, 7, 2))
		done <- err
	}()
	poll(t, "the request behind it", func() bool { return m.Stats().Queued == 4 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if q := m.Stats().Queued; q != 2 {
		t.Errorf("%d rows queued after the cancel, want 2", q)
	}
	release()
	wg.Wait()
	<-first
}

func TestNew_BadConfig(t *testing.T) {
	ok := testConfig(&behaviour{}, 4)
	for name, change := range map[string]func(*Config){
		"no New":         func(c *Config) { c.New = nil },
		"max batch 0":    func(c *Config) { c.MaxBatch = 0 },
		"no input":       func(c *Config) { c.Input = nil },
		"bad output":     func(c *Config) { c.Output = tensordict.RowSchema{{Key: []string{""}, DType: memmap.Float32}} },
		"small queue":    func(c *Config) { c.MaxQueue = 2 },
		"replicas -1":    func(c *Config) { c.Replicas = -1 },
		"negative lease": func(c *Config) { c.Lease = -time.Second },
	} {
		cfg := ok
		change(&cfg)
		if m, err := New(cfg); !errors.Is(err, ErrConfig) {
			if m != nil {
				m.Close()
			}
			t.Errorf("%s: err %v, want ErrConfig", name, err)
		}
	}
	cfg := ok
	cfg.New = func(int) (Model, error) { return nil, errors.New("no GPU") }
	if _, err := New(cfg); err == nil {
		t.Error("New with a failing constructor succeeded")
	}
}

var errCanceled = context.Canceled

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	return ctx, cancel
}

// TestManager_CloseStopsTheRunningBatch: a batch whose Forward Close
// interrupts (its context ends) fails with ErrStopped, which remote
// clients retry, and its replica's model is not replaced. Before, it
// failed with ErrForward, as if the model were at fault, and the replica
// built a new model during Close.
func TestManager_CloseStopsTheRunningBatch(t *testing.T) {
	b := &behaviour{gate: make(chan struct{}), started: make(chan int, 10)}
	m := newManager(t, testConfig(b, 1))
	errc := make(chan error, 1)
	go func() {
		_, _, err := m.Predict(ctxT(t), rowsOf(t, 1, 1))
		errc <- err
	}()
	<-b.started // its Forward runs, waiting on the gate or its context
	built := b.built.Load()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrStopped) || errors.Is(err, ErrForward) {
		t.Errorf("the request in the running batch: %v; want ErrStopped", err)
	}
	if st := m.Stats(); st.Replaced != 0 || b.built.Load() != built {
		t.Errorf("%d models replaced, %d built during Close; want none", st.Replaced, b.built.Load()-built)
	}
}
