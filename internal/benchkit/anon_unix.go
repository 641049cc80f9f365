//go:build unix

package benchkit

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Anon maps n bytes of anonymous memory outside the Go heap, every page
// touched, so that it neither counts as Go heap nor faults when measured.
// Release it with Free.
func Anon(n int) ([]byte, error) {
	// MAP_PRIVATE, as malloc's memory is: mmap-go's anonymous mappings are
	// MAP_SHARED, which Linux backs with shmem, a different baseline.
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d anonymous bytes: %w", n, err)
	}
	Fill(b, 0xa5)
	return b, nil
}

// Free unmaps a buffer from Anon.
func Free(b []byte) error { return unix.Munmap(b) }
