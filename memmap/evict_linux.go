package memmap

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Evict makes the next access to the tensor cold: it flushes writes (for a
// read-write tensor), drops this process's page-table entries for the
// mapping, and asks the kernel to drop the file's clean cached pages.
// Benchmarks use it to measure first-touch costs; long streaming jobs can use
// it to hand page cache back early. The data is unchanged.
//
// Evict needs Linux (madvise and posix_fadvise). Elsewhere it flushes and
// then returns an error wrapping errors.ErrUnsupported.
func (t *Tensor) Evict() error {
	if err := t.Flush(); err != nil {
		return err
	}
	if err := t.acquire(false); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	if t.data == nil {
		return nil
	}
	if err := unix.Madvise(t.data, unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("evict %s: madvise: %w", t.path, err)
	}
	if err := unix.Fadvise(int(t.f.Fd()), 0, int64(t.size), unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("evict %s: fadvise: %w", t.path, err)
	}
	return nil
}
