//go:build linux

package main

import "golang.org/x/sys/unix"

// yieldCPU gives the processor to another runnable thread, if any
// (sched_yield(2)): the bell's spin on a machine with more runnable
// processes than cores.
func yieldCPU() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
