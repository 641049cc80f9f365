package serve

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorwire/tensorwire/internal/backoff"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Weights: Load gives the models new parameters without stopping the
// replicas. A spare model (one more than the replicas) takes them first,
// off the serving path; a replica between batches swaps its model for the
// spare, and its old model becomes the spare, loaded next. So a replica
// never waits for a load, and never switches during a batch: it runs each
// batch with one version and reports it.

// weights is the manager's parameter state, guarded by Manager.mu.
type weights struct {
	version uint64                 // the latest version loaded into a model
	params  *tensordict.TensorDict // its parameters; nil for version 0
	spares  []*held                // models in no replica
}

// held is a model in no replica, and the version it holds.
type held struct {
	model   Model
	version uint64
	ok      bool // false: a failed Load left its weights unknown
}

// closeSpares closes the spare models; the manager is closed.
func (w *weights) closeSpares() {
	for _, h := range w.spares {
		closeModel(h.model)
	}
	w.spares = nil
}

// switchLocked swaps r's model for a spare holding the latest version, if
// r is behind and there is one. r is between batches.
func (m *Manager) switchLocked(r *replica) {
	if r.model == nil || r.remote != nil || r.version >= m.w.version {
		return
	}
	for i, h := range m.w.spares {
		if h.ok && h.version == m.w.version {
			old := &held{model: r.model, version: r.version, ok: true}
			r.model, r.version = h.model, h.version
			m.w.spares[i] = old
			m.st.switches++
			m.cond.Broadcast() // Load loads the old model next
			return
		}
	}
}

// Version returns the latest parameter version the manager has loaded
// into a model (0: the constructor's parameters). Replicas still running
// an older one switch to it between batches.
func (m *Manager) Version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.w.version
}

// Load gives the model the parameters params as the next version (the
// latest plus one), and returns it; see LoadVersion.
func (m *Manager) Load(ctx context.Context, params *tensordict.TensorDict) (uint64, error) {
	if err := m.acquireLoad(ctx); err != nil {
		return 0, err
	}
	defer m.releaseLoad()
	m.mu.Lock()
	v := m.w.version + 1
	m.mu.Unlock()
	return v, m.load(ctx, v, params)
}

// LoadVersion gives the model the parameters params as version v, which
// must be newer than the latest (ErrVersion otherwise): a version from
// elsewhere, such as a store's.
//
// The models must be Loaders (ErrConfig otherwise). A spare model loads
// params first, which checks them: if it refuses them, LoadVersion returns
// an error matching ErrParams and nothing changed. Then each replica
// switches to them between two batches, and LoadVersion returns nil once
// every model has: every response after that says version v or later.
//
// params stays the caller's, and must stay valid and unchanged until a
// later Load or LoadVersion has returned nil, or the manager is closed:
// models may keep views of it. If LoadVersion returns another error (ctx
// ended, a model failed to load params), some replicas may run version v
// and others the version before, and both sets of parameters must stay
// valid. Loads are serialized.
func (m *Manager) LoadVersion(ctx context.Context, v uint64, params *tensordict.TensorDict) error {
	if err := m.acquireLoad(ctx); err != nil {
		return err
	}
	defer m.releaseLoad()
	return m.load(ctx, v, params)
}

func (m *Manager) acquireLoad(ctx context.Context) error {
	if m.cfg.AttachedOnly {
		return configErrorf("the model's replicas are all attached processes (Config.AttachedOnly), which load their own weights: publish them to a store they follow")
	}
	select {
	case m.loadSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) releaseLoad() { <-m.loadSem }

// load is LoadVersion, with loadSem held.
func (m *Manager) load(ctx context.Context, v uint64, params *tensordict.TensorDict) error {
	if params == nil {
		return fmt.Errorf("%w: no parameters", ErrParams)
	}
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return ErrStopped
	case v <= m.w.version:
		latest := m.w.version
		m.mu.Unlock()
		return fmt.Errorf("%w: version %d; the latest is %d", ErrVersion, v, latest)
	}
	for _, r := range m.replicas {
		if _, ok := r.model.(Loader); r.model != nil && !ok {
			m.mu.Unlock()
			return configErrorf("the model (%T) is not a Loader: its parameters cannot change", r.model)
		}
	}
	h := m.takeSpareLocked(0)
	m.mu.Unlock()

	// The spare checks the parameters: if it refuses them, nothing changed.
	start := time.Now()
	if h == nil {
		model, err := newModel(m.cfg.New, m.cfg.Replicas)
		if err != nil {
			return fmt.Errorf("serve: making the spare model: %w", err)
		}
		h = &held{model: model}
	}
	if err := loadModel(ctx, h.model, params); err != nil {
		m.putSpare(h, false, 0)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %w", ErrParams, err)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		closeModel(h.model)
		return ErrStopped
	}
	m.w.version, m.w.params = v, params
	m.putSpareLocked(h, true, v)
	m.log.Info("serve: loading new parameters", "version", v, "first_load", time.Since(start))

	// Replicas swap their models for the spare between batches; each old
	// model is loaded in turn.
	defer context.AfterFunc(ctx, m.wake)()
	for {
		if m.closed {
			m.mu.Unlock()
			return ErrStopped
		}
		if h := m.takeSpareLocked(v); h != nil {
			m.mu.Unlock()
			err := loadModel(ctx, h.model, params)
			if err != nil && ctx.Err() != nil {
				m.putSpare(h, false, 0)
				return ctx.Err()
			}
			if err != nil {
				// Once more, with a new model.
				m.log.Warn("serve: a spare model failed to load parameters it took before; making a new one", "version", v, "err", err)
				closeModel(h.model)
				model, err := newModel(m.cfg.New, m.cfg.Replicas)
				if err == nil {
					if err = loadModel(ctx, model, params); err != nil {
						closeModel(model)
					}
				}
				if err != nil {
					return fmt.Errorf("serve: loading version %d into a spare model: %w", v, err)
				}
				h.model = model
			}
			m.putSpare(h, true, v)
			m.mu.Lock()
			continue
		}
		if m.allAtLocked(v) {
			m.mu.Unlock()
			m.log.Info("serve: every replica runs the new parameters", "version", v, "took", time.Since(start))
			return nil
		}
		if err := ctx.Err(); err != nil {
			m.mu.Unlock()
			return err
		}
		m.cond.Wait()
	}
}

// takeSpareLocked removes and returns a spare model whose weights are
// older than v, or unknown; nil if there is none.
func (m *Manager) takeSpareLocked(v uint64) *held {
	for i, h := range m.w.spares {
		if !h.ok || h.version < v || v == 0 {
			m.w.spares = append(m.w.spares[:i], m.w.spares[i+1:]...)
			return h
		}
	}
	return nil
}

func (m *Manager) putSpare(h *held, ok bool, v uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		closeModel(h.model)
		return
	}
	m.putSpareLocked(h, ok, v)
}

func (m *Manager) putSpareLocked(h *held, ok bool, v uint64) {
	h.ok, h.version = ok, v
	m.w.spares = append(m.w.spares, h)
	m.cond.Broadcast() // replicas waiting for a batch switch now
}

// allAtLocked reports whether every model holds version v or later.
func (m *Manager) allAtLocked(v uint64) bool {
	for _, r := range m.replicas {
		if r.remote != nil {
			continue // it loads its own weights
		}
		if r.model == nil || r.version < v {
			return false
		}
	}
	for _, h := range m.w.spares {
		if !h.ok || h.version < v {
			return false
		}
	}
	return true
}

// loadModel calls model's Load, turning a panic into an error.
func loadModel(ctx context.Context, model Model, params *tensordict.TensorDict) (err error) {
	l, ok := model.(Loader)
	if !ok {
		return fmt.Errorf("the model (%T) is not a Loader", model)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the model's Load panicked: %v", p)
		}
	}()
	return l.Load(ctx, params)
}

// replace gives replica r a new model after its Forward failed: New, then
// the latest parameters. It tries again, backing off, until it succeeds
// or the manager closes, each wait drawn with full jitter below a bound
// of 50 ms doubling to 5 s; r serves nothing meanwhile, and the other
// replicas take its share.
func (m *Manager) replace(r *replica, cause error) {
	m.log.Error("serve: a replica's forward failed; replacing its model", "replica", r.index, "err", cause)
	m.mu.Lock()
	old := r.model
	r.model, r.replacing = nil, true
	m.mu.Unlock()
	closeModel(old)
	wait := backoff.Backoff{Base: 50 * time.Millisecond, Max: 5 * time.Second}
	for {
		m.mu.Lock()
		v, params := m.w.version, m.w.params
		m.mu.Unlock()
		model, err := newModel(m.cfg.New, r.index)
		if err == nil && params != nil {
			if err = loadModel(m.ctx, model, params); err != nil {
				closeModel(model)
			}
		}
		if err == nil {
			m.mu.Lock()
			r.model, r.version, r.replacing = model, v, false
			m.st.replaced++
			m.cond.Broadcast()
			m.mu.Unlock()
			m.log.Info("serve: replica replaced", "replica", r.index, "version", v)
			return
		}
		m.log.Error("serve: making a replica's new model failed; trying again", "replica", r.index, "err", err, "within", wait.Bound())
		if wait.Wait(m.ctx) != nil {
			return
		}
	}
}
