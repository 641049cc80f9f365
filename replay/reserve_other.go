//go:build !linux

package replay

import "os"

// reserveBlocks does nothing outside Linux, which alone has fallocate: a
// slot table made sparse by a copy (cp --sparse, rsync -S) keeps its holes,
// and writing a slot on a full disk can then fault (SIGBUS) instead of
// failing here. Tables the buffer creates itself are reserved by
// memmap.Create.
func reserveBlocks(f *os.File, size int64) error { return nil }
