// Package atomicfile replaces files so that readers, and the disk after a
// crash, see either the old content or the whole new one: the way the
// project writes meta.json files and benchmark results.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data, durably: it writes data to a temporary
// file in the same directory, sets its mode to perm, fsyncs it, renames it
// over path and fsyncs the directory. Before the rename an error leaves no
// temporary file and path unchanged; only the final directory fsync can fail
// after path holds the new data.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return writeFile(path, data, perm, true)
}

// WriteFileUnsynced is WriteFile without its fsyncs: readers see the old
// content or the whole new one, but a crash may leave either, or neither,
// until the caller syncs the file and its directory.
func WriteFileUnsynced(path string, data []byte, perm os.FileMode) error {
	return writeFile(path, data, perm, false)
}

func writeFile(path string, data []byte, perm os.FileMode, sync bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if !sync {
		return nil
	}
	return SyncDir(dir)
}

// SyncDir fsyncs the directory dir, so that files created, renamed or
// removed in it survive a crash.
func SyncDir(dir string) error { return Sync(dir) }

// Sync opens path (a file or a directory) read-only and fsyncs it: a
// file's data and size, a directory's entries.
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// MkdirAll makes dir and any parents it lacks, as os.MkdirAll does, and
// fsyncs the parent of each folder it makes, so that the folders (and what
// is made durable in them afterwards) survive a crash. A dir that exists
// is left as it is, unsynced.
func MkdirAll(dir string, perm os.FileMode) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("mkdir %s: not a directory", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, perm); err != nil {
		if fi, serr := os.Stat(dir); serr != nil || !fi.IsDir() {
			return err // not made by another process meanwhile
		}
	}
	return SyncDir(parent)
}
