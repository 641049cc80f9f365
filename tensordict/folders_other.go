//go:build !unix

package tensordict

import "io/fs"

// fileID is a file's identity where idOf can tell it; here it cannot
// (a FileInfo on Windows holds no file index until os.SameFile asks for
// it), so folders compares with os.SameFile.
type fileID struct{}

// idOf reports that fi's identity is not at hand.
func idOf(fs.FileInfo) (fileID, bool) { return fileID{}, false }
