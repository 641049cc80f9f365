//go:build unix

package benchkit

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time this process has used so far, user and
// system, over all its threads; -1 where it cannot be read.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
