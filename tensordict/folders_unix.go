//go:build unix

package tensordict

import (
	"io/fs"
	"syscall"
)

// fileID is a file's identity: its device and inode.
type fileID struct{ dev, ino uint64 }

// idOf returns fi's identity, if fi is from a stat of this system's.
func idOf(fi fs.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{uint64(st.Dev), uint64(st.Ino)}, true
}
