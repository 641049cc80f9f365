//go:build !linux

package store

import "os"

// writeFrames appends frames to f with one write, through buf.
func writeFrames(f *os.File, frames [][]byte, buf *[]byte) (int, error) {
	b := (*buf)[:0]
	for _, fr := range frames {
		b = append(b, fr...)
	}
	*buf = b
	return f.Write(b)
}

// syncData makes f's data durable: fsync (macOS's fsync reaches the
// drive's cache only, as everywhere the project runs).
func syncData(f *os.File) error { return f.Sync() }
