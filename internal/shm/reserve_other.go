//go:build !linux

package shm

import "os"

// Reserve does nothing outside Linux, which alone has fallocate: a file
// with holes keeps them, and a write into one on a full disk can fault
// (SIGBUS) instead of failing here.
func Reserve(f *os.File, size int64) error { return nil }
