package replay

import "golang.org/x/sys/unix"

// totalMemory returns the machine's RAM (sysctl hw.memsize).
func totalMemory() (uint64, bool) {
	n, err := unix.SysctlUint64("hw.memsize")
	return n, err == nil && n > 0
}

// freeDisk returns the bytes an unprivileged writer may still use on the
// filesystem holding dir, if the system says.
func freeDisk(dir string) (uint64, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0, false
	}
	return st.Bavail * uint64(st.Bsize), true
}
