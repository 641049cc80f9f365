package store

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tensorwire/tensorwire/tensordict"
)

// The roles of distributed reinforcement learning, after tensorshare's
// RLTrainer and RLWorker: a trainer publishes network parameters with a
// version and drains the rollouts workers add, each tagged with the
// version of the parameters that made it; workers read the latest
// parameters, wait for newer ones, and add rollouts.

// RoleOption configures a Trainer or a Worker.
type RoleOption func(*roleOptions)

type roleOptions struct {
	params   string
	rollouts string
	filter   bool
}

func newRoleOptions(opts []RoleOption) (roleOptions, error) {
	o := roleOptions{params: "parameters", rollouts: "data", filter: true}
	for _, opt := range opts {
		opt(&o)
	}
	if err := CheckName(o.params); err != nil {
		return o, err
	}
	return o, CheckName(o.rollouts)
}

// ParamsName names the parameter set the roles use; default "parameters",
// tensorshare's.
func ParamsName(name string) RoleOption { return func(o *roleOptions) { o.params = name } }

// RolloutsBin names the bin rollouts go to; default "data", tensorshare's.
func RolloutsBin(name string) RoleOption { return func(o *roleOptions) { o.rollouts = name } }

// FilterVersion sets whether Trainer.Rollouts keeps only rollouts made with
// the latest parameters it published (default true, as tensorshare's
// filter_version), dropping off-policy ones.
func FilterVersion(on bool) RoleOption { return func(o *roleOptions) { o.filter = on } }

// The keys of a rollout item in the rollouts bin: tensorshare's.
const (
	rolloutData    = "data"
	rolloutVersion = "version"
)

// Rollout is one rollout a worker added, with the version of the
// parameters it was made with.
type Rollout struct {
	TD      *tensordict.TensorDict
	Version uint64
	item    *tensordict.TensorDict
}

// Close releases the rollout's storage (a mapping, for large ones).
func (r Rollout) Close() error { return r.item.Close() }

// Trainer is tensorshare's RLTrainer: it publishes parameters and drains
// rollouts. It is safe for concurrent use.
type Trainer struct {
	api API
	o   roleOptions

	mu      sync.Mutex
	version uint64
	dropped int
}

// NewTrainer returns a trainer working on api (a *Store or a *Client).
func NewTrainer(api API, opts ...RoleOption) (*Trainer, error) {
	o, err := newRoleOptions(opts)
	if err != nil {
		return nil, err
	}
	return &Trainer{api: api, o: o}, nil
}

// Publish publishes td as the next version of the parameters and returns
// it; Rollouts filters by it from then on.
func (t *Trainer) Publish(ctx context.Context, td *tensordict.TensorDict) (uint64, error) {
	v, err := t.api.Publish(ctx, t.o.params, td)
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	t.version = max(t.version, v)
	t.mu.Unlock()
	return v, nil
}

// Version returns the latest version this trainer published (0: none).
func (t *Trainer) Version() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.version
}

// Dropped returns how many rollouts Rollouts has dropped for being made
// with older parameters.
func (t *Trainer) Dropped() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// Rollouts drains the rollouts bin (Get) and returns its rollouts, oldest
// first; with FilterVersion (the default), only those made with the
// latest version this trainer published, the others being dropped and
// counted (Dropped). Items that are not rollouts are skipped and reported
// by an error matching ErrFormat, returned with the valid rollouts. Close
// each rollout when done.
func (t *Trainer) Rollouts(ctx context.Context) ([]Rollout, error) {
	items, err := t.api.Get(ctx, t.o.rollouts)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	latest := t.version
	t.mu.Unlock()
	var out []Rollout
	var errs []error
	dropped := 0
	for _, item := range items {
		r, err := parseRollout(item)
		switch {
		case err != nil:
			errs = append(errs, err)
			item.Close()
		case t.o.filter && r.Version < latest:
			dropped++
			item.Close()
		default:
			out = append(out, r)
		}
	}
	t.mu.Lock()
	t.dropped += dropped
	t.mu.Unlock()
	if len(errs) > 0 {
		return out, errorf(ErrFormat, "%d items of bin %q are not rollouts: %v", len(errs), t.o.rollouts, errors.Join(errs...))
	}
	return out, nil
}

func parseRollout(item *tensordict.TensorDict) (Rollout, error) {
	data, err := item.Dict(rolloutData)
	if err != nil {
		return Rollout{}, err
	}
	nt, err := item.NonTensor(rolloutVersion)
	if err != nil {
		return Rollout{}, err
	}
	v, ok := asUint(nt.Data)
	if !ok {
		return Rollout{}, fmt.Errorf("version %v is not a version number", nt.Data)
	}
	return Rollout{TD: data, Version: v, item: item}, nil
}

// Worker is tensorshare's RLWorker: it reads parameters and adds rollouts
// tagged with the version of the parameters it read last. It is safe for
// concurrent use.
type Worker struct {
	api API
	o   roleOptions

	mu      sync.Mutex
	version uint64
}

// NewWorker returns a worker working on api (a *Store or a *Client).
func NewWorker(api API, opts ...RoleOption) (*Worker, error) {
	o, err := newRoleOptions(opts)
	if err != nil {
		return nil, err
	}
	return &Worker{api: api, o: o}, nil
}

// Params returns the latest parameters (ErrNotFound if none were
// published yet: WaitNewer waits for them) and makes their version the
// one AddRollout tags rollouts with. Close the Param when done with it.
func (w *Worker) Params(ctx context.Context) (*Param, error) {
	p, err := w.api.Latest(ctx, w.o.params)
	if err != nil {
		return nil, err
	}
	w.took(p.Version)
	return p, nil
}

// WaitNewer waits until parameters newer than the ones this worker read
// last are published (the first ones, if it read none), and returns them
// as Params does.
func (w *Worker) WaitNewer(ctx context.Context) (*Param, error) {
	w.mu.Lock()
	v := w.version
	w.mu.Unlock()
	p, err := w.api.WaitNewer(ctx, w.o.params, v)
	if err != nil {
		return nil, err
	}
	w.took(p.Version)
	return p, nil
}

func (w *Worker) took(v uint64) {
	w.mu.Lock()
	w.version = max(w.version, v)
	w.mu.Unlock()
}

// Version returns the version of the parameters read last (0: none).
func (w *Worker) Version() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.version
}

// AddRollout appends td to the rollouts bin with the version of the
// parameters read last, and returns once the store has it (tensorshare's
// add_data returns at once; call AddRollout from a goroutine for that).
func (w *Worker) AddRollout(ctx context.Context, td *tensordict.TensorDict) error {
	item, err := tensordict.New()
	if err != nil {
		return err
	}
	if err := item.Set(rolloutData, td); err != nil {
		return errorf(ErrFormat, "%v", err)
	}
	if err := item.Set(rolloutVersion, &tensordict.NonTensor{Data: w.Version()}); err != nil {
		return err
	}
	_, err = w.api.Append(ctx, w.o.rollouts, item)
	return err
}
