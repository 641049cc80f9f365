package slots

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// reserveBlocks allocates the disk blocks of f's first size bytes, keeping
// their contents (fallocate, mode 0). Filesystems without fallocate are
// left as they are.
func reserveBlocks(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err != nil && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	return nil
}
