//go:build !linux

package shm

import "time"

// Without futexes, Wait polls the word (poll.go), and Wake reaches the
// waiters of this process only.
func wait(w *Uint32, old uint32, d time.Duration) { pollWait(w, old, d) }
func wake(*Uint32)                                { pollWake() }

// Futex reports whether Wait and Wake reach other processes (a futex):
// false here, where a waiter sees another process's change by polling.
const Futex = false
