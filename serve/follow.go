package serve

import (
	"context"
	"errors"
	"fmt"

	"github.com/tensorwire/tensorwire/store"
)

// ParamSource is where Follow finds parameters: a store, in this process
// (*store.Store) or served by a node (*store.Client).
type ParamSource interface {
	WaitNewer(ctx context.Context, name string, v uint64) (*store.Param, error)
}

var (
	_ ParamSource = (*store.Store)(nil)
	_ ParamSource = (*store.Client)(nil)
)

// Follow loads every new version of the parameter set name from src into
// the models, with the store's version numbers (LoadVersion), until ctx
// ends, and returns ctx's error then; it waits for a first version if
// none is published. By reference a version is a read-only mapping of
// the store's files, which the models may view without copying.
//
// The manager keeps the store.Param of each version while a model may
// use it (its lease keeps the store from deleting it), and closes it once
// every model has loaded a later one, or at Close. A version the models
// refuse (ErrParams) is logged and skipped: the models keep the one
// before. A version older than the manager's latest (it loaded a newer
// one from elsewhere) is skipped too. Other errors of src or of a load end
// Follow with that error.
//
// Run it on a goroutine of its own: go m.Follow(ctx, st, "policy").
func (m *Manager) Follow(ctx context.Context, src ParamSource, name string) error {
	after := m.Version()
	for {
		p, err := src.WaitNewer(ctx, name, after)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("serve: following parameters %q: %w", name, err)
		}
		err = m.LoadParam(ctx, p)
		switch {
		case err == nil:
		case errors.Is(err, ErrParams), errors.Is(err, ErrVersion):
			m.log.Error("serve: skipping parameters the models refuse", "name", name, "version", p.Version, "err", err)
		default:
			return err
		}
		after = p.Version
	}
}

// LoadParam loads a version read from a store (store.Latest, WaitNewer)
// as LoadVersion(ctx, p.Version, p.TD) does, and takes p: the manager
// closes it (its lease) once every model has loaded a later version, or at
// Close; and at once if no model took it (an error matching ErrParams,
// ErrVersion or ErrStopped).
func (m *Manager) LoadParam(ctx context.Context, p *store.Param) error {
	err := m.LoadVersion(ctx, p.Version, p.TD)
	switch {
	case err == nil:
		m.keepParams(p, true)
	case errors.Is(err, ErrParams), errors.Is(err, ErrVersion), errors.Is(err, ErrStopped):
		p.Close()
	default:
		// Some models may have loaded p: keep it, and the ones before,
		// until a later version is loaded everywhere.
		m.keepParams(p, false)
	}
	return err
}

// keepParams keeps p until it is no longer used. When every model has
// loaded it (all), the versions kept before are closed.
func (m *Manager) keepParams(p *store.Param, all bool) {
	m.mu.Lock()
	var old []*store.Param
	if all {
		old = m.kept
		m.kept = nil
	}
	if m.closed {
		old = append(old, p)
	} else {
		m.kept = append(m.kept, p)
	}
	m.mu.Unlock()
	for _, q := range old {
		q.Close()
	}
}
