//go:build !unix

package benchkit

import (
	"fmt"

	"github.com/edsrzf/mmap-go"
)

// Anon maps n bytes of anonymous memory outside the Go heap, every page
// touched, so that it neither counts as Go heap nor faults when measured.
// Release it with Free.
func Anon(n int) ([]byte, error) {
	b, err := mmap.MapRegion(nil, n, mmap.RDWR, mmap.ANON, 0)
	if err != nil {
		return nil, fmt.Errorf("mmap %d anonymous bytes: %w", n, err)
	}
	Fill(b, 0xa5)
	return b, nil
}

// Free unmaps a buffer from Anon.
func Free(b []byte) error {
	m := mmap.MMap(b)
	return m.Unmap()
}
