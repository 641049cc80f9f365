package memmap

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// reserve sets f's size to size and allocates its blocks, so that writes
// through a mapping never meet a full disk. It uses fallocate; filesystems
// without it get explicit zeros instead.
func reserve(f *os.File, size int64) error {
	if size == 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("reserve %d bytes: %w", size, err)
	}
	return writeZeros(f, size)
}
