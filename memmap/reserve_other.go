//go:build !linux

package memmap

import "os"

// reserve sets f's size to size and allocates its blocks, so that writes
// through a mapping never meet a full disk. Without Linux's fallocate it
// writes the zeros: slower for large files (it writes every byte once), with
// the same guarantee.
func reserve(f *os.File, size int64) error {
	return writeZeros(f, size)
}
