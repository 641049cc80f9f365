//go:build !linux && !darwin

package replay

// totalMemory does not know the machine's RAM on this system: Config's
// memory check is skipped (Create still fails if allocation does).
func totalMemory() (uint64, bool) { return 0, false }

// freeDisk does not know the free space on this system: Create's disk
// check is skipped, and a full disk is ENOSPC from the storage's creation.
func freeDisk(string) (uint64, bool) { return 0, false }
