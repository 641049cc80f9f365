package memmap

import "golang.org/x/sys/unix"

// StartWriteback asks the kernel to start writing the bytes [off, off+n)
// of t's file to the disk now and returns without waiting for them
// (sync_file_range with SYNC_FILE_RANGE_WRITE). It is a hint that makes
// nothing durable: a writer that fills a large file piece by piece calls it
// after each piece, so that the disk works on the first pieces while the
// last are written, and the Flush (or tensordict.SyncPrefix) that follows
// waits for the tail only. Errors are ignored, the sync decides. It does
// nothing for a read-only or closed tensor, and nothing elsewhere than
// Linux.
func (t *Tensor) StartWriteback(off, n int64) {
	if t.acquire(true) != nil {
		return
	}
	defer t.mu.RUnlock()
	if off < 0 || n <= 0 || off >= int64(t.size) {
		return
	}
	n = min(n, int64(t.size)-off)
	unix.SyncFileRange(int(t.f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}
