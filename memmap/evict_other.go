//go:build !linux

package memmap

import (
	"errors"
	"fmt"
)

// Evict makes the next access to the tensor cold: it flushes writes (for a
// read-write tensor), drops this process's page-table entries for the
// mapping, and asks the kernel to drop the file's clean cached pages.
// Benchmarks use it to measure first-touch costs; long streaming jobs can use
// it to hand page cache back early. The data is unchanged.
//
// Evict needs Linux (madvise and posix_fadvise). Here it flushes and then
// returns an error wrapping errors.ErrUnsupported, so that nothing measures
// warm pages as cold.
func (t *Tensor) Evict() error {
	if err := t.Flush(); err != nil {
		return err
	}
	return fmt.Errorf("evict %s: %w: dropping cached pages needs Linux", t.path, errors.ErrUnsupported)
}
