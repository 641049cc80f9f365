package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// checkLayout checks the folder dir before Open (or Repair) uses it,
// without following any link in it, and reports whether it holds a log:
//   - The store's own entries (LOCK, store.log, values/, staging/, trash/)
//     that exist must be a file or a folder as the store makes them, never
//     a symbolic link: ErrExists, naming the link (a store never follows a
//     link out of its folder, to delete or write there).
//   - A folder with a log is a store: other files in it are left alone.
//   - A folder without one may be missing, empty, or hold what a store
//     being created makes before its log (LOCK, values/, staging/ and
//     trash/ empty, and the log's temporary file, .store.log.tmp-*, which
//     a process killed while creating it leaves). Anything else is ErrExists (not a store: nothing of it
//     is ours to delete), or ErrLost when LOCK shows a store lived here
//     (its log was removed: a new store over its values would drop them).
func checkLayout(dir string) (hasLog bool, err error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: %w", err)
	}
	for _, name := range []string{lockName, logName, valuesDir, stagingDir, trashDir} {
		p := filepath.Join(dir, name)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("store: %w", err)
		}
		folder := name == valuesDir || name == stagingDir || name == trashDir
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			return false, fmt.Errorf("%w: %s is a symbolic link (to %s): a store follows no link in its folder; "+
				"make it a folder (or file) of its own", ErrExists, p, target)
		case folder && !fi.IsDir():
			return false, fmt.Errorf("%w: %s is not a folder", ErrExists, p)
		case !folder && !fi.Mode().IsRegular():
			return false, fmt.Errorf("%w: %s is not a file", ErrExists, p)
		}
		hasLog = hasLog || name == logName
	}
	if hasLog {
		return true, nil
	}
	var found []string
	locked := false
	for _, e := range ents {
		switch name := e.Name(); name {
		case lockName:
			locked = true
		case valuesDir, stagingDir, trashDir:
			sub, err := os.ReadDir(filepath.Join(dir, name))
			if err != nil {
				return false, fmt.Errorf("store: %w", err)
			}
			for _, f := range sub {
				found = append(found, name+"/"+f.Name())
			}
		default:
			if isLogTemp(e) {
				continue // a log being created when its process died
			}
			found = append(found, name)
		}
	}
	if len(found) == 0 {
		return false, nil
	}
	list := strings.Join(found[:min(len(found), 3)], ", ")
	if len(found) > 3 {
		list += fmt.Sprintf(" and %d more", len(found)-3)
	}
	if locked {
		return false, fmt.Errorf("%w: %s is missing, but %s holds a store's files (%s): its log was removed; "+
			"Open starts no new store over them (Options.Repair, the node's --store NAME,repair=drop, starts one and drops them)", ErrLost, filepath.Join(dir, logName), dir, list)
	}
	return false, fmt.Errorf("%w: %s holds %s but no %s: it is not a store, and a store never deletes what it did not make; "+
		"give the store a folder of its own", ErrExists, dir, list, logName)
}

// isLogTemp reports whether e is a temporary file of createLog's
// (atomicfile's name for store.log before its rename).
func isLogTemp(e fs.DirEntry) bool {
	return e.Type().IsRegular() && strings.HasPrefix(e.Name(), "."+logName+".tmp-")
}

// removeLogTemps removes what isLogTemp names in dir: called once a new
// log is in place, by the process that owns the folder.
func removeLogTemps(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if isLogTemp(e) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
