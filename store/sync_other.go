//go:build !linux

package store

import "os"

// syncData makes f's data durable: fsync (macOS's fsync reaches the
// drive's cache only, as everywhere the project runs).
func syncData(f *os.File) error { return f.Sync() }
