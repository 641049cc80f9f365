package shm

import "golang.org/x/sys/unix"

// Yield gives the processor to another runnable thread of any process,
// if there is one (sched_yield(2)), for a waiter that spins on a word
// another process will change: the process that will change it may need
// this core. It is a raw system call: Go's scheduler is not told, since
// the call does not block.
//
// runtime.Gosched is not the same: it yields only to this process's
// goroutines, and in a process with an idle P it wakes another thread to
// look for work, a wake-up per call. In serve's clients, which waited
// with four of them, that made Go's default GOMAXPROCS lose to
// GOMAXPROCS 1 at 128 clients (docs/benchmarks.md, "Yielding without
// Go's scheduler").
func Yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
