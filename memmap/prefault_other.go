//go:build !linux

package memmap

import (
	"errors"
	"fmt"
)

// Prefault maps every page of the tensor into this process's page tables
// now, by reading (see the Linux build for what it is for). Here it changes
// nothing and returns an error wrapping errors.ErrUnsupported: it needs
// Linux's MADV_POPULATE_READ.
func (t *Tensor) Prefault() error {
	if err := t.acquire(false); err != nil {
		return err
	}
	t.mu.RUnlock()
	return fmt.Errorf("prefault %s: %w: it needs Linux", t.path, errors.ErrUnsupported)
}
