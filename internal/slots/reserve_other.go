//go:build !linux

package slots

import "os"

// reserveBlocks does nothing outside Linux, which alone has fallocate: a
// table made sparse by a copy (cp --sparse, rsync -S) keeps its holes,
// and writing a word on a full disk can then fault (SIGBUS) instead of
// failing in Open. Tables made by Create are reserved by
// memmap.Create.
func reserveBlocks(f *os.File, size int64) error { return nil }
