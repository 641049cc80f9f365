//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd || solaris

package lockfile

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// lock takes an exclusive flock on f without waiting. flock locks belong to
// the open file, so the kernel drops them when the last descriptor of it
// closes: at Release, or when the process dies.
func lock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK), errors.Is(err, unix.EAGAIN):
			return errWouldBlock
		}
		return err
	}
}

func unlock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_UN) }

// noFollow makes OpenFile fail on a symbolic link where the system can.
const noFollow = unix.O_NOFOLLOW
