//go:build unix

package rpc

import (
	"io/fs"
	"syscall"
)

// fileIDOf returns the device and inode of fi.
func fileIDOf(fi fs.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{uint64(st.Dev), st.Ino}, true
}
