package memmap

import "fmt"

// Flush makes the tensor's writes durable: msync of the mapping (mmap-go's
// Flush; FlushViewOfFile on Windows), then fsync of the file. It is a no-op
// for a read-only tensor.
func (t *Tensor) Flush() error {
	if err := t.acquire(false); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	if !t.writable {
		return nil
	}
	if t.data != nil {
		if err := t.data.Flush(); err != nil {
			return fmt.Errorf("flush %s: msync: %w", t.path, err)
		}
	}
	if err := t.f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", t.path, err)
	}
	return nil
}
