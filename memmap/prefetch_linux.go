package memmap

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// prefetchMin is the smallest row for which prefetch pays: below it, the
// syscall per row costs more than the faults it saves.
const prefetchMin = 256 << 10

var pageSize = os.Getpagesize()

// prefetch asks the kernel to read in, all at once, the rows about to be
// copied whose first page is not resident. Touching cold pages one fault at
// a time reads the disk serially; MADV_WILLNEED starts readahead for the
// whole row, measured at 4-5x faster for cold 1.2 MB rows. Warm rows cost
// one mincore call each. Errors are ignored: this is only a hint. The
// caller holds t.mu or a pin. Other systems do not prefetch (prefetch_other.go).
func (t *Tensor) prefetch(off int64, rowBytes int, rows []int) {
	if rowBytes < prefetchMin {
		return
	}
	var resident [1]byte
	for _, r := range rows {
		start := int(off) + r*rowBytes
		page := start &^ (pageSize - 1) // the mapping starts page-aligned
		if mincore(t.data[page:page+1], resident[:]) != nil || resident[0]&1 != 0 {
			continue
		}
		unix.Madvise(t.data[page:start+rowBytes], unix.MADV_WILLNEED)
	}
}

// mincore reports in vec, one byte per page of b (bit 0 set if resident),
// which pages of b are in memory. b must start on a page boundary.
func mincore(b []byte, vec []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MINCORE,
		uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return errno
	}
	return nil
}
