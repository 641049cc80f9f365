package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Manager runs a model's replicas and batches the requests of many callers
// onto them: torch_spread's manager and its model workers in one process.
//
// Requests join the open batch, whose rows are gathered (copied into the
// batch's buffer, each request by its own caller) while the replicas run
// the batches before it. The open batch is closed when a replica is free
// to run it, not before: requests that arrive while every replica is busy
// join it until it is full (Config.MaxBatch), and behind it wait in order
// for the next. A request is never split between batches. Config.Policy
// says whether a free replica takes the open batch at once (Greedy) or
// waits for it to fill (MaxDelay).
//
// Each replica gets its inputs from one of Replicas+1 batch buffers: one
// per running batch and one for the open batch, so the next batch is
// gathered while the others run (torch_spread's two buffers per worker,
// shared).
//
// A Manager is safe for concurrent use. Close it when done.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context // the context of Forward and Load calls: ends at Close
	cancel context.CancelFunc

	mu       sync.Mutex
	cond     *sync.Cond // open batch, copies, replicas' states, weights
	closed   bool
	open     *batch
	overflow []*request // FIFO behind the open batch
	queued   int        // rows in the open batch and the overflow
	held     int        // free replicas the policy holds back from the open batch
	free     []*buffer
	replicas []*replica
	w        weights // guarded by mu
	loadSem  chan struct{}
	kept     []*store.Param // Follow's versions that models may use
	needs    string         // the model type, when it needs parameters before it predicts (ParamsNeeder)
	st       counters

	// Attached replicas (attach.go): batches whose replica went away
	// before answering, to run again on another; buffers to drop when
	// they come back free (one per replica detached); the timer that
	// fails what waits while no replica is there.
	retry   []*batch
	surplus int
	orphan  *time.Timer
	nextIdx int

	wg sync.WaitGroup // the replicas' goroutines
}

// replica is one model and the goroutine that runs its batches. Its
// fields are guarded by Manager.mu.
type replica struct {
	index     int
	model     Model // nil while replaced
	version   uint64
	busy      bool // running a batch
	replacing bool
	timer     *time.Timer // wakes it when the policy's wait ends

	remote *remote // an attached replica (attach.go); nil: in this process
	gone   bool    // an attached replica detached: its goroutine ends
}

// buffer is a batch's input buffer: MaxBatch rows in Go memory.
type buffer struct {
	td *tensordict.TensorDict
	f  fields
}

// batch is the open batch, then a batch a replica runs. Its fields are
// guarded by Manager.mu until done is closed; out, outF, version and err
// are read-only after.
type batch struct {
	in      *buffer
	rows    int
	reqs    int
	first   time.Time // when its first request joined
	copying int       // requests still copying their rows in
	taken   bool      // a replica took it
	tries   int       // replicas that went away while running it (attach.go)

	async []*request // its requests without a waiting goroutine (submit)

	done    chan struct{}
	out     *tensordict.TensorDict
	outF    fields // out's tensors
	version uint64
	err     error
}

// request is one call's place in a batch.
type request struct {
	n      int
	b      *batch // nil until placed
	off    int
	placed chan struct{} // closed when a request that waited behind the open batch is placed, or the manager stops

	// A request made by submit has no goroutine waiting for it: fill,
	// drain and done are its callbacks, and the replica that runs its
	// batch fills it if it joined the batch late (filled false), then
	// drains it and calls done.
	fill   func(buf fields, row int) error
	drain  func(out *tensordict.TensorDict, f fields, row int) error
	done   func(version uint64, err error)
	filled bool
	err    error // fill's
	fail   error // why a request that waited behind the open batch was never placed (attach.go); nil: stopped
}

// New starts a manager for cfg: it builds the replicas' models (cfg.New)
// and starts them. An error from a constructor stops it and is returned.
func New(cfg Config) (*Manager, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, log: cfg.Log, loadSem: make(chan struct{}, 1)}
	m.cond = sync.NewCond(&m.mu)
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if cfg.AttachedOnly {
		return m.startAttachedOnly()
	}
	for i := range cfg.Replicas + 1 {
		td, err := cfg.Input.Zeros(cfg.MaxBatch)
		if err != nil {
			return nil, configErrorf("input buffer: %v", err)
		}
		f, err := fieldsOf(td, cfg.Input)
		if err != nil {
			return nil, err
		}
		m.free = append(m.free, &buffer{td: td, f: f})
		if i == cfg.Replicas {
			break
		}
		model, err := newModel(cfg.New, i)
		if err != nil {
			for _, r := range m.replicas {
				closeModel(r.model)
			}
			m.cancel()
			return nil, fmt.Errorf("serve: replica %d: %w", i, err)
		}
		r := &replica{index: i, model: model}
		r.timer = time.AfterFunc(time.Hour, m.wake)
		r.timer.Stop()
		m.replicas = append(m.replicas, r)
	}
	if pn, ok := m.replicas[0].model.(ParamsNeeder); ok && pn.NeedsParams() {
		m.needs = fmt.Sprintf("%T", pn)
	}
	m.st.hist = make([]uint64, cfg.MaxBatch+1)
	m.nextIdx = len(m.replicas)
	for _, r := range m.replicas {
		m.wg.Add(1)
		go m.serve(r)
	}
	return m, nil
}

// newModel calls New, turning a panic or a nil model into an error.
func newModel(build func(int) (Model, error), i int) (m Model, err error) {
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("the model constructor panicked: %v", p)
		}
	}()
	m, err = build(i)
	if err == nil && m == nil {
		err = errors.New("the model constructor returned no model")
	}
	return m, err
}

// closeModel closes m if it is an io.Closer.
func closeModel(m Model) {
	if c, ok := m.(io.Closer); ok {
		c.Close()
	}
}

// Input returns the schema of one input row.
func (m *Manager) Input() tensordict.RowSchema { return m.cfg.Input.Clone() }

// Output returns the schema of one output row.
func (m *Manager) Output() tensordict.RowSchema { return m.cfg.Output.Clone() }

// MaxBatch returns the most rows a batch, and so a request, holds.
func (m *Manager) MaxBatch() int { return m.cfg.MaxBatch }

// Predict runs the model on in, a TensorDict of batch size [n] with the
// input schema's fields, 1 <= n <= MaxBatch, batched with other callers'
// requests, and returns the outputs (batch size [n], in Go memory) and the
// parameter version that produced them (0: the constructor's). in is read
// before Predict returns and not kept.
//
// Errors: ErrSchema for an input that does not fit (nothing is queued),
// ErrNoParams before the first Load of models that need one
// (ParamsNeeder), ErrQueueFull, ErrForward, ErrStopped, or ctx's error.
// Once its rows are in a batch, a call that ctx ends returns at once, and
// the batch runs without it.
func (m *Manager) Predict(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error) {
	n, err := checkRows(in, m.cfg.Input, m.cfg.MaxBatch, "input")
	if err != nil {
		return nil, 0, err
	}
	src, err := fieldsOf(in, m.cfg.Input)
	if err != nil {
		return nil, 0, err
	}
	out, err := m.cfg.Output.Zeros(n)
	if err != nil {
		return nil, 0, err
	}
	dst, err := fieldsOf(out, m.cfg.Output)
	if err != nil {
		return nil, 0, err
	}
	v, err := m.run(ctx, n,
		func(buf fields, row int) error { return copyRows(buf, row, src, 0, n) },
		func(_ *tensordict.TensorDict, res fields, row int) error { return copyRows(dst, 0, res, row, n) })
	if err != nil {
		return nil, 0, err
	}
	return out, v, nil
}

// PredictInto is Predict writing the outputs into out, a TensorDict of
// batch size [n] with (at least) the output schema's fields, instead of
// allocating them. out may be a memory mapping. On an error out's rows may
// have been written in part.
func (m *Manager) PredictInto(ctx context.Context, in, out *tensordict.TensorDict) (uint64, error) {
	n, err := checkRows(in, m.cfg.Input, m.cfg.MaxBatch, "input")
	if err != nil {
		return 0, err
	}
	if err := checkOut(out, m.cfg.Output, n); err != nil {
		return 0, err
	}
	src, err := fieldsOf(in, m.cfg.Input)
	if err != nil {
		return 0, err
	}
	dst, err := fieldsOf(out, m.cfg.Output)
	if err != nil {
		return 0, err
	}
	return m.run(ctx, n,
		func(buf fields, row int) error { return copyRows(buf, row, src, 0, n) },
		func(_ *tensordict.TensorDict, res fields, row int) error { return copyRows(dst, 0, res, row, n) })
}

// checkOut checks that out can take n output rows of schema: batch size
// [n] and every field of schema, with its dtype and row shape.
func checkOut(out *tensordict.TensorDict, schema tensordict.RowSchema, n int) error {
	if out == nil {
		return schemaErrorf("no output TensorDict")
	}
	if b := out.BatchSize(); !slices.Equal(b, []int{n}) {
		return schemaErrorf("output of batch size %v for %d rows", b, n)
	}
	have := map[string]tensordict.RowField{}
	for _, f := range out.RowSchema() {
		have[fmt.Sprint(f.Key)] = f
	}
	for _, f := range schema {
		g, ok := have[fmt.Sprint(f.Key)]
		if !ok || g.DType != f.DType || !slices.Equal(g.Shape, f.Shape) {
			return schemaErrorf("output has no field %v", f)
		}
	}
	return nil
}

// run queues a request of n rows, copies them into its batch with fill
// (given the batch buffer's fields and the request's first row there),
// waits for the batch and hands its outputs to drain (the model's result,
// its fields, and the request's first row in it; valid during the call).
func (m *Manager) run(ctx context.Context, n int, fill func(buf fields, row int) error,
	drain func(out *tensordict.TensorDict, f fields, row int) error) (uint64, error) {
	r, err := m.enqueue(ctx, n)
	if err != nil {
		return 0, err
	}
	b := r.b
	err = fill(b.in.f, r.off)
	m.mu.Lock()
	if b.copying--; b.copying == 0 && b.taken {
		m.cond.Broadcast()
	}
	m.mu.Unlock()
	if err != nil {
		// The batch runs garbage in this request's rows; nobody reads them.
		return 0, err
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if b.err != nil {
		return b.version, b.err
	}
	if err := drain(b.out, b.outF, r.off); err != nil {
		return 0, fmt.Errorf("serve: handing out the outputs: %w", err)
	}
	return b.version, nil
}

// enqueue places a request of n rows in the open batch, or behind it and
// waits until it is placed in a later one.
func (m *Manager) enqueue(ctx context.Context, n int) (*request, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrStopped
	}
	if err := m.noParamsLocked(); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	if m.queued+n > m.cfg.MaxQueue {
		m.st.queueFull++
		q := m.queued
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: %d rows wait already, at most %d (Config.MaxQueue)", ErrQueueFull, q, m.cfg.MaxQueue)
	}
	m.queued += n
	m.st.requests++
	m.armOrphanLocked()
	r := &request{n: n}
	if m.placeNowLocked(r) {
		m.mu.Unlock()
		return r, nil
	}
	r.placed = make(chan struct{})
	m.overflow = append(m.overflow, r)
	m.mu.Unlock()
	select {
	case <-r.placed:
	case <-ctx.Done():
		m.mu.Lock()
		if r.b == nil && !m.closed && r.fail == nil { // failOrphans took it out of the queue already
			if i := slices.Index(m.overflow, r); i >= 0 {
				m.overflow = slices.Delete(m.overflow, i, i+1)
			}
			m.queued -= n
			m.mu.Unlock()
			return nil, ctx.Err()
		}
		m.mu.Unlock()
		// Placed meanwhile (its rows must be copied in: run does that,
		// then returns ctx's error), or stopped.
	}
	if r.b == nil {
		if r.fail != nil {
			return nil, r.fail
		}
		return nil, ErrStopped
	}
	return r, nil
}

// noParamsLocked returns ErrNoParams while the models need parameters
// and none were loaded.
func (m *Manager) noParamsLocked() error {
	if m.needs != "" && m.w.version == 0 {
		return fmt.Errorf("%w: the model (%s) has none until the first Load (Manager.Load, LoadVersion or Follow); "+
			"it would compute with its constructor's (zero) weights", ErrNoParams, m.needs)
	}
	return nil
}

// placeNowLocked places r in the open batch, opening one if there is
// none, when nothing waits behind it and r fits; it reports whether it
// did.
func (m *Manager) placeNowLocked(r *request) bool {
	if len(m.overflow) > 0 {
		return false
	}
	if m.open == nil {
		m.openBatchLocked()
	}
	if m.open == nil || m.open.rows+r.n > m.cfg.MaxBatch {
		return false
	}
	m.placeLocked(r)
	return true
}

// submit queues a request of n rows without waiting for it, as run does
// with a goroutine waiting: fill copies its rows into the batch (on this
// goroutine when it joins the open batch now, else on the replica's that
// takes its batch), and the replica that runs the batch calls drain with
// the outputs and then done, with the version or the error. An error
// returned by submit itself (ErrStopped, ErrQueueFull) means nothing was
// queued, and done is not called.
//
// It is how requests by bell (bellnode.go) go: the node's poller submits
// them and the replicas answer, with no goroutine per request.
func (m *Manager) submit(n int, fill func(buf fields, row int) error,
	drain func(out *tensordict.TensorDict, f fields, row int) error, done func(uint64, error)) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrStopped
	}
	if err := m.noParamsLocked(); err != nil {
		m.mu.Unlock()
		return err
	}
	if m.queued+n > m.cfg.MaxQueue {
		m.st.queueFull++
		q := m.queued
		m.mu.Unlock()
		return fmt.Errorf("%w: %d rows wait already, at most %d (Config.MaxQueue)", ErrQueueFull, q, m.cfg.MaxQueue)
	}
	m.queued += n
	m.st.requests++
	m.armOrphanLocked()
	r := &request{n: n, fill: fill, drain: drain, done: done}
	if !m.placeNowLocked(r) {
		m.overflow = append(m.overflow, r)
		m.mu.Unlock()
		return nil
	}
	b := r.b
	m.mu.Unlock()
	r.err, r.filled = fill(b.in.f, r.off), true
	m.mu.Lock()
	if b.copying--; b.copying == 0 && b.taken {
		m.cond.Broadcast()
	}
	m.mu.Unlock()
	return nil
}

// openBatchLocked makes a new open batch if a buffer is free, and moves
// the requests waiting behind into it, in order, while they fit.
func (m *Manager) openBatchLocked() {
	if m.closed || len(m.free) == 0 {
		return
	}
	in := m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	b := &batch{in: in, done: make(chan struct{})}
	m.open = b
	k := 0
	for k < len(m.overflow) && b.rows+m.overflow[k].n <= m.cfg.MaxBatch {
		r := m.overflow[k]
		m.placeLocked(r)
		if r.done != nil {
			b.copying-- // the replica that takes the batch fills it
		} else {
			close(r.placed)
		}
		k++
	}
	if k > 0 {
		m.overflow = slices.Delete(m.overflow, 0, k)
	}
}

// placeLocked gives r the next rows of the open batch.
func (m *Manager) placeLocked(r *request) {
	b := m.open
	r.b, r.off = b, b.rows
	b.rows += r.n
	b.reqs++
	b.copying++
	if r.done != nil {
		b.async = append(b.async, r)
	}
	if b.reqs == 1 {
		b.first = time.Now()
		m.cond.Broadcast() // a free replica can take it
	} else if m.held > 0 {
		m.cond.Broadcast() // a replica the policy holds back asks it again (or takes the batch, full)
	}
}

// wake wakes the goroutines waiting on the manager's condition.
func (m *Manager) wake() {
	m.mu.Lock()
	m.cond.Broadcast()
	m.mu.Unlock()
}

// serve is a replica's goroutine: it takes batches and runs them until the
// manager closes.
func (m *Manager) serve(r *replica) {
	defer m.wg.Done()
	for {
		b, ok := m.take(r)
		if !ok {
			return
		}
		m.runBatch(r, b)
	}
}

// take waits until r can run the open batch, as the policy says, takes it
// and opens the next; it switches r's model to new weights first, when
// there are (weights.go). It returns false once the manager is closed.
func (m *Manager) take(r *replica) (*batch, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		if m.closed || r.gone {
			return nil, false
		}
		if len(m.retry) > 0 {
			// A batch whose attached replica went away before answering.
			b := m.retry[0]
			m.retry = m.retry[1:]
			r.busy = true
			return b, true
		}
		m.switchLocked(r)
		if m.needs != "" && r.version == 0 && r.remote == nil {
			// Its model has no parameters yet: it runs nothing until it
			// switches to the first version a Load gives a spare.
			m.cond.Wait()
			continue
		}
		if m.open == nil {
			m.openBatchLocked()
		}
		b := m.open
		if b == nil || b.reqs == 0 {
			m.cond.Wait()
			continue
		}
		if b.rows < m.cfg.MaxBatch {
			if wait := m.cfg.Policy.Wait(b.first, b.rows, m.cfg.MaxBatch); wait > 0 {
				r.timer.Reset(wait)
				m.held++
				m.cond.Wait()
				m.held--
				r.timer.Stop()
				continue
			}
		}
		m.open = nil
		m.queued -= b.rows
		b.taken = true
		r.busy = true
		m.openBatchLocked()
		for b.copying > 0 {
			m.cond.Wait()
		}
		return b, true
	}
}

// runBatch runs b on r's model and hands out the result. A failed Forward
// fails b's requests and replaces r's model.
func (m *Manager) runBatch(r *replica, b *batch) {
	for _, q := range b.async {
		if !q.filled {
			q.err, q.filled = q.fill(b.in.f, q.off), true
		}
	}
	start := time.Now()
	in, err := b.in.td.Slice(0, b.rows)
	var out *tensordict.TensorDict
	var outF fields
	version := r.version
	if err == nil && r.remote != nil {
		out, version, err = r.remote.forward(m.ctx, in)
		if err != nil && m.retryElsewhere(r, b, err) {
			return
		}
	} else if err == nil {
		out, err = forward(m.ctx, r.model, in)
	}
	if err == nil {
		out, err = checkResult(out, in, m.cfg.Output, b.rows)
	}
	if err == nil {
		outF, err = fieldsOf(out, m.cfg.Output)
	}
	if err != nil && m.ctx.Err() != nil {
		// Close ended the Forward's context: the batch was stopped, and
		// the model is not at fault.
		err = fmt.Errorf("%w: its batch was running: %v", ErrStopped, err)
	}
	took := time.Since(start)
	m.mu.Lock()
	m.putBufferLocked(b.in) // the inputs are not needed any more
	if m.open == nil {
		m.openBatchLocked()
	}
	b.out, b.outF, b.version, b.err = out, outF, version, err
	m.st.batches++
	m.st.rows += uint64(b.rows)
	m.st.hist[b.rows]++
	m.st.forward += took
	r.busy = false
	if err != nil {
		m.st.failed++
		m.st.failedRows += uint64(b.rows)
	}
	m.cond.Broadcast() // Load waits for replicas between batches
	m.mu.Unlock()
	close(b.done)
	answerAsync(b)
	switch {
	case err != nil && r.remote != nil:
		m.detach(r, err)
	case errors.Is(err, ErrStopped):
		// Stopped by Close, which closes the model.
	case err != nil:
		m.replace(r, err)
	}
}

// answerAsync hands the outputs of a batch that is done to its requests
// made by submit, and calls their done.
func answerAsync(b *batch) {
	for _, q := range b.async {
		switch {
		case b.err != nil:
			q.done(b.version, b.err)
		case q.err != nil:
			q.done(0, q.err)
		default:
			err := q.drain(b.out, b.outF, q.off)
			if err != nil {
				err = fmt.Errorf("serve: handing out the outputs: %w", err)
			}
			q.done(b.version, err)
		}
	}
}

// forward calls model.Forward, turning a panic into an error, and a memory
// fault on its goroutine (a SIGBUS on a mapping whose file was truncated)
// into a panic first (debug.SetPanicOnFault), so that it fails the batch
// and not the process.
func forward(ctx context.Context, model Model, in *tensordict.TensorDict) (out *tensordict.TensorDict, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if f, ok := p.(interface{ Addr() uintptr }); ok {
				out, err = nil, fmt.Errorf("%w: the model faulted at address %#x (%v): is a mapping it reads truncated?", ErrForward, f.Addr(), p)
				return
			}
			out, err = nil, fmt.Errorf("%w: the model panicked: %v", ErrForward, p)
		}
	}()
	out, err = model.Forward(ctx, in)
	if err != nil && !errors.Is(err, ErrForward) {
		err = fmt.Errorf("%w: %w", ErrForward, err)
	}
	return out, err
}

// checkResult checks a Forward's result: n rows of the output schema. A
// result that shares memory with the input buffer (a model that returned
// its input, or views of it) is copied, since the buffer is reused.
func checkResult(out, in *tensordict.TensorDict, schema tensordict.RowSchema, n int) (*tensordict.TensorDict, error) {
	if out == nil {
		return nil, fmt.Errorf("%w: the model returned no outputs", ErrForward)
	}
	if b := out.BatchSize(); len(b) != 1 || b[0] != n {
		return nil, fmt.Errorf("%w: the model returned outputs of batch size %v for %d rows", ErrForward, b, n)
	}
	if err := schema.Match(out.RowSchema()); err != nil {
		return nil, fmt.Errorf("%w: the model's outputs: %v", ErrForward, err)
	}
	if sharesMemory(out, in) {
		return out.Clone()
	}
	return out, nil
}

// sharesMemory reports whether a tensor of a lies in the memory of a
// tensor of b (both in Go memory).
func sharesMemory(a, b *tensordict.TensorDict) bool {
	type span struct{ lo, hi uintptr }
	var spans []span
	for _, t := range b.Leaves() {
		if p, n := heapSpan(t); n > 0 {
			spans = append(spans, span{p, p + n})
		}
	}
	for _, t := range a.Leaves() {
		p, n := heapSpan(t)
		for _, s := range spans {
			if n > 0 && p < s.hi && s.lo < p+n {
				return true
			}
		}
	}
	return false
}

// Close stops the manager: requests still queued fail with ErrStopped,
// the context of the Forward calls running ends (a batch whose Forward
// then fails gets ErrStopped too, and its model is not replaced), and
// Close returns once they have returned, closing the models that are
// io.Closers. Close does not close the parameters given to Load.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	var stopped []*request // made by submit: their done is called below
	if b := m.open; b != nil {
		m.open = nil
		b.err = ErrStopped
		close(b.done)
		stopped = append(stopped, b.async...)
	}
	for _, r := range m.overflow {
		if r.done != nil {
			stopped = append(stopped, r)
		} else {
			close(r.placed)
		}
	}
	m.overflow, m.queued = nil, 0
	retry := m.retry
	m.retry = nil
	if m.orphan != nil {
		m.orphan.Stop()
	}
	m.cond.Broadcast()
	m.mu.Unlock()
	for _, r := range stopped {
		r.done(0, ErrStopped)
	}
	for _, b := range retry {
		b.err = ErrStopped
		close(b.done)
		answerAsync(b)
	}
	m.cancel()
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.replicas {
		r.timer.Stop()
		closeModel(r.model)
		r.model = nil
	}
	m.w.closeSpares()
	for _, p := range m.kept {
		p.Close()
	}
	m.kept = nil
	return nil
}
