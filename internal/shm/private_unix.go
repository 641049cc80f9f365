//go:build unix

package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Private maps n bytes of anonymous private memory (MAP_PRIVATE, as
// malloc's is) outside the Go heap: the benchmarks' buffers, which must
// neither count as Go heap nor be shmem, as mmap-go's anonymous mappings
// (MAP_SHARED) are on Linux. Release it with FreePrivate; the slice is
// invalid after.
func Private(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d anonymous bytes: %w", n, err)
	}
	return b, nil
}

// FreePrivate unmaps memory from Private.
func FreePrivate(b []byte) error { return unix.Munmap(b) }
