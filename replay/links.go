package replay

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/tensordict"
)

// refuseLinks checks the buffer's own entries at prefix (LockFile,
// MetaFile, SlotsFile, StorageDir) without following any: one that is a
// symbolic link is an error wrapping sentinel that names it. A buffer maps
// its slot table and storage read-write and writes its lock and meta file:
// a link planted there would make it write, or map, what lies outside its
// folder.
func refuseLinks(prefix string, sentinel error) error {
	for _, name := range []string{LockFile, MetaFile, SlotsFile, StorageDir} {
		p := filepath.Join(prefix, name)
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		target, _ := os.Readlink(p)
		return fmt.Errorf("%w: %s is a symbolic link (to %s): a buffer follows no link in its folder; "+
			"make it a file or folder of its own", sentinel, p, target)
	}
	return nil
}

// loadInFolder maps the TensorDict at dir, under the buffer's folder
// prefix, read-write unless opts say otherwise, through an os.Root on
// prefix: a file or folder reached through a link that leads out of the
// buffer's folder is an error, never mapped.
func loadInFolder(prefix, dir string, opts ...tensordict.LoadOption) (*tensordict.TensorDict, error) {
	root, err := os.OpenRoot(prefix)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return tensordict.LoadMemmap(dir, append(opts, tensordict.InRoot(root))...)
}
