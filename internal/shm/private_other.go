//go:build !unix

package shm

import (
	"fmt"

	"github.com/edsrzf/mmap-go"
)

// Private maps n bytes of anonymous memory outside the Go heap (mmap-go's
// anonymous mapping, the closest this system has to MAP_PRIVATE). Release
// it with FreePrivate; the slice is invalid after.
func Private(n int) ([]byte, error) {
	b, err := mmap.MapRegion(nil, n, mmap.RDWR, mmap.ANON, 0)
	if err != nil {
		return nil, fmt.Errorf("mmap %d anonymous bytes: %w", n, err)
	}
	return b, nil
}

// FreePrivate unmaps memory from Private.
func FreePrivate(b []byte) error {
	m := mmap.MMap(b)
	return m.Unmap()
}
