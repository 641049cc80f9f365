//go:build windows

package lockfile

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// lockOffsetHigh is the high half of the offset of the locked byte, 2^62:
// far past the content, because Windows locks are mandatory and a locked
// byte cannot be read by others, who must read the holder's pid.
const lockOffsetHigh = 1 << 30

// lock takes an exclusive LockFileEx lock on one byte of f without waiting.
// Windows drops it when the handle closes: at Release, or when the process
// dies.
func lock(f *os.File) error {
	ol := &windows.Overlapped{OffsetHigh: lockOffsetHigh}
	err := windows.LockFileEx(windows.Handle(f.Fd()),
		windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) || errors.Is(err, windows.ERROR_IO_PENDING) {
		return errWouldBlock
	}
	return err
}

func unlock(f *os.File) error {
	ol := &windows.Overlapped{OffsetHigh: lockOffsetHigh}
	return windows.UnlockFileEx(windows.Handle(f.Fd()), 0, 1, 0, ol)
}

// noFollow makes OpenFile fail on a symbolic link where the system can.
const noFollow = 0
