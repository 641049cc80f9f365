package shm

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// wait is a futex wait on the word: the kernel sleeps while it holds old,
// for d at most. The futex is shared (not FUTEX_PRIVATE): waiter and waker
// may be different processes mapping the same file page.
func wait(w *Uint32, old uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexOpWait, uintptr(old), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// wake wakes every waiter on the word, in every process. It passes w's
// address (v is at offset 0) without touching it: &w.v would be a nil
// check, a load, which faults on a page of a truncated file.
func wake(w *Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexOpWake, uintptr(1<<30), 0, 0, 0)
}

// futex operations (linux/futex.h), on shared words: not FUTEX_PRIVATE.
const (
	futexOpWait = 0
	futexOpWake = 1
)

// Futex reports whether Wait and Wake reach other processes (a futex):
// true on Linux.
const Futex = true
