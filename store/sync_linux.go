package store

import (
	"io"
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

// writeFrames appends frames to f with writev, without copying them into
// one buffer first; buf is unused here. It returns the bytes written,
// all of them unless err is set.
func writeFrames(f *os.File, frames [][]byte, buf *[]byte) (int, error) {
	fd := int(f.Fd())
	total := 0
	for len(frames) > 0 {
		iov := frames[:min(len(frames), 1024)] // IOV_MAX
		n, err := unix.Writev(fd, iov)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, io.ErrShortWrite
		}
		total += n
		for n > 0 { // skip what was written, a frame in part if need be
			if n < len(frames[0]) {
				frames[0] = frames[0][n:]
				break
			}
			n -= len(frames[0])
			frames = frames[1:]
		}
	}
	return total, nil
}
