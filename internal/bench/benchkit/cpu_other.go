//go:build !unix

package benchkit

import "time"

// ProcessCPU returns -1: a process's CPU time is not read outside Unix, and
// the figures made from it are left out.
func ProcessCPU() time.Duration { return -1 }
