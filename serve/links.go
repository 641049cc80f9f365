package serve

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/tensorwire/tensorwire/internal/lockfile"
)

// Clients make their folders under the node's root, and the node maps
// files from them, writes into them and removes those of dead clients: a
// symbolic link planted on the way (by a careless user, or a client with
// the token) must not lead the node to a folder that is not that
// client's. Every folder of ClientsDir and BellsDir is opened with
// openFolder, which follows no link; the files in a client's folder are
// opened through an os.Root on it, so none is reached outside it.

// openFolder opens the folder name in parent as an os.Root without
// following a link: a name that is a symbolic link, or not a folder, is an
// error naming it, as is a folder replaced between the check and the open.
func openFolder(parent *os.Root, name string) (*os.Root, error) {
	p := filepath.Join(parent.Name(), name)
	fi, err := parent.Lstat(name)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ := parent.Readlink(name)
		return nil, fmt.Errorf("%s is a symbolic link (to %s): serve follows no link in the folders its clients and nodes make; remove it", p, target)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a folder", p)
	}
	r, err := parent.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	if now, err := r.Stat("."); err != nil || !os.SameFile(fi, now) {
		r.Close()
		return nil, fmt.Errorf("%s was replaced while it was opened", p)
	}
	return r, nil
}

// openPath opens rel, a slash-separated path of folders under root, each
// by openFolder. The caller closes what it returns.
func openPath(root *os.Root, rel string) (*os.Root, error) {
	cur := root
	for _, part := range strings.Split(rel, "/") {
		next, err := openFolder(cur, part)
		if cur != root {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// checkFolders checks that rel under the folder root is reached without
// following a link.
func checkFolders(root, rel string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	d, err := openPath(r, rel)
	if err != nil {
		return err
	}
	return d.Close()
}

// removeIfDead removes rel, a client's folder (or a node's bell's) under
// root, if its lock can be taken, and reports whether it did. Nothing is
// reached through a link: a folder on the way, or the folder itself, that
// is one is left (and the link with it).
func removeIfDead(root, rel string) bool {
	r, err := os.OpenRoot(root)
	if err != nil {
		return false
	}
	defer r.Close()
	parentRel, name := path.Split(rel)
	parent, err := openPath(r, strings.TrimSuffix(parentRel, "/"))
	if err != nil {
		return false
	}
	defer parent.Close()
	d, err := openFolder(parent, name)
	if err != nil {
		return false
	}
	l, err := lockfile.AcquireIn(d, "lock")
	d.Close()
	if err != nil {
		return false
	}
	defer l.Release()
	return parent.RemoveAll(name) == nil
}
