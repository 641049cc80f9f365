//go:build !unix

package loader

// cpuNS returns 0: this system's CPU time is not read here, so the
// benchmark's CPU figures are 0 (the benchmark's nodes need Unix anyway).
func cpuNS() int64 { return 0 }
