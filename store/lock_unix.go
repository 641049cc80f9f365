//go:build unix

package store

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// TODO(internal/lockfile): use the project's lock package once it lands;
// this is the same flock, kept small until then.

// lockFile holds an exclusive flock on a file for as long as the process
// lives or until unlock. The kernel drops it when the process dies, so a
// node killed with SIGKILL leaves no stale lock.
type lockFile struct{ f *os.File }

func lock(path string) (*lockFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked", ErrLocked, path)
		}
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
	}
	return &lockFile{f: f}, nil
}

func (l *lockFile) unlock() error { return l.f.Close() } // closing drops the flock
