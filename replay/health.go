package replay

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
)

// checkEvery is how often, at most, calls check every file of a buffer;
// in between they check only its lock file, one stat.
const checkEvery = time.Second

// health returns the error the buffer fails calls with once its files are
// lost (ErrStorageLost, for good), or nil. It checks the lock file every
// time, one stat: the folder deleted or moved is found by the next call.
// It checks every file the buffer maps, for being deleted, replaced or
// truncated, when full is set and otherwise at most every checkEvery.
// b.mu is not held: the stats run outside it.
func (b *Buffer) health(full bool) error {
	b.mu.Lock()
	lost, files := b.lost, b.files
	all := full || time.Since(b.checkedAt) >= checkEvery
	if all {
		b.checkedAt = time.Now()
	}
	b.mu.Unlock()
	if lost != nil {
		return lost
	}
	cause := b.checkFiles(files, all)
	if cause == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.loseLocked(cause)
}

// healthLocked is health(true) with b.mu held, for a reserve that found
// every slot held.
func (b *Buffer) healthLocked() error {
	if b.lost != nil {
		return b.lost
	}
	b.checkedAt = time.Now()
	if cause := b.checkFiles(b.files, true); cause != nil {
		return b.loseLocked(cause)
	}
	return nil
}

// checkFiles returns why the buffer's files are lost, or nil: its lock
// file, and files too when all is set.
func (b *Buffer) checkFiles(files []ownedFile, all bool) error {
	if b.lock != nil {
		if err := b.lock.Check(); err != nil {
			return fmt.Errorf("its folder or lock file was deleted, moved or replaced (%w)", err)
		}
	}
	if !all {
		return nil
	}
	for _, f := range files {
		fi, err := os.Stat(f.path)
		switch {
		case err != nil:
			return err
		case !os.SameFile(fi, f.fi):
			return fmt.Errorf("%s was replaced by another file", f.path)
		case fi.Size() < f.fi.Size():
			return fmt.Errorf("%s was truncated to %d bytes from %d", f.path, fi.Size(), f.fi.Size())
		}
	}
	return nil
}

// loseLocked makes the buffer fail every call from now on with
// ErrStorageLost for cause, and wakes the calls waiting; b.mu is held.
func (b *Buffer) loseLocked(cause error) error {
	if b.lost == nil {
		b.lost = fmt.Errorf("%w: %s: %w", ErrStorageLost, b.prefix, cause)
		b.broadcast()
	}
	return b.lost
}

// noteFault checks the buffer's files after err, a fault on the mappings:
// it returns the buffer's ErrStorageLost if they were lost (a file
// truncated under the mapping), and err otherwise. A fault alone is not a
// loss: writing into a hole of a sparse file on a full disk faults too,
// and works again once there is room.
func (b *Buffer) noteFault(err error) error {
	if !errors.Is(err, memmap.ErrFault) {
		return err
	}
	if lost := b.health(true); lost != nil {
		return lost
	}
	return err
}
