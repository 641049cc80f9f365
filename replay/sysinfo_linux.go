package replay

import "golang.org/x/sys/unix"

// totalMemory returns the machine's RAM, if the system says.
func totalMemory() (uint64, bool) {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil || si.Totalram == 0 {
		return 0, false
	}
	return uint64(si.Totalram) * uint64(max(si.Unit, 1)), true
}

// freeDisk returns the bytes an unprivileged writer may still use on the
// filesystem holding dir, if the system says.
func freeDisk(dir string) (uint64, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
}
