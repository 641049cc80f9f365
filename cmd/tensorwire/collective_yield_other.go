//go:build !linux

package main

import "runtime"

// yieldCPU lets other goroutines run (no sched_yield(2) here).
func yieldCPU() { runtime.Gosched() }
