package shm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Reserve allocates the disk (or tmpfs) blocks of f's first size bytes,
// keeping their contents and growing a shorter file to size (fallocate,
// mode 0), so that writing them through a mapping cannot meet a full disk:
// that would be a SIGBUS, a failed Reserve is an error wrapping ENOSPC.
// Filesystems without fallocate are left as they are.
func Reserve(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err != nil && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("reserving %d bytes for %s: %w", size, f.Name(), err)
	}
	return nil
}
