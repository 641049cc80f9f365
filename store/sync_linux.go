package store

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncData makes f's data durable, and the metadata needed to read it (its
// size): fdatasync, which skips timestamps.
func syncData(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			return err
		}
	}
}
