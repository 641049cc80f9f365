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

// startWriteback asks the kernel to start writing f's bytes [off, off+n)
// to the disk now, without waiting for it (sync_file_range with
// SYNC_FILE_RANGE_WRITE): a hint, so that a large value's writeback
// overlaps the writing of the rest of it and the sync that follows (the
// prefix's, tensordict.SyncPrefix) waits for the tail only. It promises
// nothing about durability, and an error is ignored: that sync decides.
func startWriteback(f *os.File, off, n int64) {
	unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
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
