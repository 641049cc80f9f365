//go:build !linux

package shm

import "runtime"

// Yield gives the processor to another goroutine (runtime.Gosched): the
// raw sched_yield of Linux is not used here.
func Yield() { runtime.Gosched() }
