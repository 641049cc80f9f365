//go:build !unix

package rpc

import "io/fs"

// fileIDOf reports false outside Unix, where a FileInfo carries no device
// and inode: references to shared storage are then refused (Internal, "no
// inode"); a Windows node serves calls that ship bytes only.
func fileIDOf(fi fs.FileInfo) (fileID, bool) { return fileID{}, false }
