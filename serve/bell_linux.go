package serve

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// bellSupported: requests by reference ring a bell in shared memory
// (bell.go) on Linux, where futexes work on words of shared mappings.
const bellSupported = true

// createShared makes the file at path of size bytes, its blocks reserved
// (a write into a hole of a full tmpfs through a mapping is SIGBUS; a
// failed fallocate, an error now), zero-filled, and maps it.
func createShared(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		os.Remove(path)
		return nil, fmt.Errorf("reserving %d bytes for %s: %w", size, path, err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(path)
		return nil, err
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return b, nil
}

// openShared maps the file f, read-write and shared, checking it holds
// size bytes. The caller opened f (through the node's os.Root).
func openShared(f *os.File, size int) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() < int64(size) {
		return nil, fmt.Errorf("%s: %d bytes, want a regular file of %d", f.Name(), fi.Size(), size)
	}
	return unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func unmapShared(b []byte) {
	if b != nil {
		unix.Munmap(b)
	}
}

// futexWait sleeps while *addr == val, for d at most; it may return early.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every process sleeping on addr.
func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, uintptr(1<<30), 0, 0, 0)
}

// futex operations (linux/futex.h), on shared words: not FUTEX_PRIVATE.
const (
	futexOpWait = 0
	futexOpWake = 1
)
