//go:build !linux

package serve

import "time"

// sleepFor sleeps d (time.Sleep: the fake model's cost is less exact off
// Linux).
func sleepFor(d time.Duration) { time.Sleep(d) }

// cpuTime returns -1: a process's CPU time is read on Linux only.
func cpuTime() time.Duration { return -1 }
