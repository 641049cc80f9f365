package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/tensorwire/tensorwire/internal/lockfile"
)

// lock takes the store's lock file: one process serves a store. The
// kernel drops the lock when its holder dies, so a node killed with
// SIGKILL leaves nothing stale behind.
//
// The lock is per open file, so a second Open in the process holding it
// fails too; openDirs tells that case apart, to say so.
func lock(path string) (*lockfile.Lock, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if openDirs[path] {
		return nil, fmt.Errorf("%w: %s is already open in this process (close that Store first)", ErrLocked, filepath.Dir(path))
	}
	l, err := lockfile.Acquire(path)
	if errors.Is(err, lockfile.ErrLocked) {
		return nil, fmt.Errorf("%w: %w", ErrLocked, err)
	}
	if err == nil {
		openDirs[path] = true
	}
	return l, err
}

var (
	openMu   sync.Mutex
	openDirs = map[string]bool{} // the lock files this process holds
)

// unlock releases a lock lock took.
func unlock(l *lockfile.Lock, path string) error {
	openMu.Lock()
	defer openMu.Unlock()
	delete(openDirs, path)
	return l.Release()
}
