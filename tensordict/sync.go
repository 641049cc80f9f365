package tensordict

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
)

// SyncPrefix makes the memmap folder at prefix durable: it fsyncs every
// regular file in it, then every folder, the deepest first and prefix
// last, following no symbolic link. After Memmap or MemmapLike with
// Unsynced, and writes into the files with write or pwrite, it gives the
// durability the synced forms give, in one sync a file and a folder.
// Writes through a mapping are flushed by it on Linux, where fsync writes
// back the pages a mapping dirtied; elsewhere Flush the TensorDict first.
// The first error stops it, naming the path.
func SyncPrefix(prefix string) error {
	var dirs []string
	err := filepath.WalkDir(prefix, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			dirs = append(dirs, path)
		case d.Type().IsRegular():
			return atomicfile.Sync(path)
		}
		return nil // a link or a special file: not followed, not synced
	})
	if err != nil {
		return fmt.Errorf("sync %s: %w", prefix, err)
	}
	for _, dir := range slices.Backward(dirs) {
		if err := atomicfile.Sync(dir); err != nil {
			return fmt.Errorf("sync %s: %w", prefix, err)
		}
	}
	return nil
}
