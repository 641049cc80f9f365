package importer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The names tensordict's format uses in a dataset's folders.
const (
	metaFile   = "meta.json"
	leafSuffix = ".memmap"
	pickleFile = "other.pickle" // NonTensorData pickled by Python's tensordict
	tmpInfix   = ".tmp-"        // ".NAME.tmp-*": a write interrupted by a crash
)

// checkPrefix says whether something is at prefix that an import with Force
// may replace (a dataset or an empty folder): exists is true then. It
// returns false and no error if nothing is there, and an error wrapping
// ErrNotReplaceable, naming prefix and the reason, if what is there is not
// ours to replace. It changes nothing.
func checkPrefix(prefix string) (exists bool, err error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w %s: %s", ErrNotReplaceable, prefix, fmt.Sprintf(format, args...))
	}
	clean := filepath.Clean(prefix)
	fi, err := os.Lstat(clean)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// The folders an import can never replace come first, whatever they
	// hold: the root, and the working directory and its parents, however
	// spelled (".", "..", "../", an absolute path, a path through a
	// symbolic link).
	real, err := filepath.EvalSymlinks(clean)
	if err != nil && fi.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(clean)
		return false, refuse("it is a symbolic link (to %s, which does not resolve: %v)", target, err)
	}
	if err != nil {
		return false, err
	}
	if real, err = filepath.Abs(real); err != nil {
		return false, err
	}
	if filepath.Dir(real) == real {
		return false, refuse("it is the filesystem root")
	}
	if wd, err := os.Getwd(); err == nil {
		if wd, err = filepath.EvalSymlinks(wd); err == nil && within(wd, real) {
			return false, refuse("it is the current directory or one of its parents")
		}
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, _ := os.Readlink(clean)
		return false, refuse("it is a symbolic link (to %s), not a dataset folder; name the folder itself", target)
	case fi.Mode().IsRegular():
		return false, refuse("it is a file, not a dataset folder")
	case !fi.IsDir():
		return false, refuse("it is a %v, not a dataset folder", fi.Mode().Type())
	}
	if err := checkDataset(clean, "", true); err != nil {
		return false, refuse("%v", err)
	}
	return true, nil
}

// within reports whether path is dir or lies under it; both are absolute
// and clean.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// checkDataset returns nil if dir holds only what tensordict's format
// writes: a meta.json, <key>.memmap files, NonTensorData's other.pickle,
// leftovers of our own interrupted writes (".meta.json.tmp-*",
// ".KEY.memmap.tmp-*"), and folders that are datasets by the same rule. At
// the top (top set), an empty folder is fine too. rel is dir's path
// relative to the prefix, for the error, which names the first entry that
// does not belong.
func checkDataset(dir, rel string, top bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if top && len(entries) == 0 {
		return nil
	}
	// The files first, then the folder's meta.json, then its folders: the
	// error names what is nearest the top.
	meta := false
	var dirs []string
	for _, e := range entries {
		n, t := e.Name(), e.Type()
		switch {
		case t.IsRegular() && n == metaFile:
			meta = true
		case t.IsRegular() && (strings.HasSuffix(n, leafSuffix) || n == pickleFile || leftover(n)):
		case t.IsDir():
			dirs = append(dirs, n)
		default:
			return fmt.Errorf("%s is not part of a tensordict dataset (only meta.json, <key>.memmap files and key folders are)",
				filepath.Join(rel, n))
		}
	}
	if !meta {
		if top {
			return errors.New("it holds no meta.json: not a tensordict dataset")
		}
		return fmt.Errorf("folder %s holds no meta.json: not part of a tensordict dataset", rel)
	}
	for _, n := range dirs {
		if err := checkDataset(filepath.Join(dir, n), filepath.Join(rel, n), false); err != nil {
			return err
		}
	}
	return nil
}

// leftover reports whether name is a temporary file our writers (meta.json's
// and a leaf's) leave behind when the process dies mid-write.
func leftover(name string) bool {
	i := strings.LastIndex(name, tmpInfix)
	if i < 1 || name[0] != '.' {
		return false
	}
	base := name[1:i]
	return base == metaFile || strings.HasSuffix(base, leafSuffix)
}
