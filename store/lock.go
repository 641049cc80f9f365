package store

import (
	"errors"
	"fmt"

	"github.com/tensorwire/tensorwire/internal/lockfile"
)

// lock takes the store's lock file: one process serves a store. The
// kernel drops the lock when its holder dies, so a node killed with
// SIGKILL leaves nothing stale behind.
func lock(path string) (*lockfile.Lock, error) {
	l, err := lockfile.Acquire(path)
	if errors.Is(err, lockfile.ErrLocked) {
		return nil, fmt.Errorf("%w: %w", ErrLocked, err)
	}
	return l, err
}
