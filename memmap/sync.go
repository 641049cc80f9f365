package memmap

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Flush makes the tensor's writes durable: msync of the mapping, then fsync
// of the file. It is a no-op for a read-only tensor.
func (t *Tensor) Flush() error {
	if err := t.acquire(false); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	if !t.writable {
		return nil
	}
	if t.data != nil {
		if err := unix.Msync(t.data, unix.MS_SYNC); err != nil {
			return fmt.Errorf("flush %s: msync: %w", t.path, err)
		}
	}
	if err := t.f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", t.path, err)
	}
	return nil
}

// syncDir fsyncs a directory, making the creation, removal or renaming of
// its entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// SyncDir fsyncs the directory dir, so that files created, renamed or removed
// in it survive a crash. Writers of multi-file formats call it after their
// last rename.
func SyncDir(dir string) error { return syncDir(dir) }
