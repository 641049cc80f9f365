// Package importer builds on-disk TensorDict datasets from files in other
// formats (IDX, NumPy .npy), streaming: the data goes from the decoder into
// the mapped storage in chunks, never whole into Go memory.
//
// A dataset is built in a temporary folder next to the prefix and renamed
// into place when complete, so an interrupted or failed import never leaves
// a prefix that loads.
package importer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/tensordict"
)

// ErrExists is returned when the prefix exists and Options.Force is not set.
var ErrExists = errors.New("importer: prefix exists")

// Options control an import.
type Options struct {
	// Force replaces an existing prefix.
	Force bool
	// Progress, if not nil, receives a progress bar.
	Progress io.Writer
}

// build creates storage for batch and fields in a temporary folder next to
// prefix, runs fill on it, flushes it and renames it to prefix, durably. fill counts
// the total bytes it reads into bar, which is nil without opts.Progress.
func build(ctx context.Context, prefix string, opts Options, batch []int, fields []tensordict.Field, total int64,
	fill func(td *tensordict.TensorDict, bar *progress.Bar) error) error {
	if _, err := os.Lstat(prefix); err == nil && !opts.Force {
		return fmt.Errorf("%w: %s (use --force to replace it)", ErrExists, prefix)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var bar *progress.Bar
	if opts.Progress != nil {
		bar = progress.New(opts.Progress, "import", "B", total)
		defer bar.Done()
	}
	parent := filepath.Dir(filepath.Clean(prefix))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(prefix)+".importing-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	td, err := tensordict.Create(tmp, batch, fields...)
	if err != nil {
		return err
	}
	err = fill(td, bar)
	if err == nil {
		err = ctx.Err()
	}
	if err == nil {
		err = td.Flush()
	}
	if cerr := td.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if opts.Force {
		if err := os.RemoveAll(prefix); err != nil {
			return err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, prefix); err != nil {
		return err
	}
	return atomicfile.SyncDir(parent) // the rename survives a crash once the import returns
}

// copyInto streams a decoder's data into t from byte offset off, counting
// into bar and stopping when ctx is done. It reads src to its io.EOF, not
// just to the header's size: the decoder checks what follows the data there
// (an IDX file's trailing bytes, a gzip stream's checksum). Data that would
// run past t is an error wrapping memmap.ErrIndex.
func copyInto(ctx context.Context, t *tensordict.Tensor, off int64, src io.Reader, bar *progress.Bar) error {
	buf := make([]byte, 1<<20)
	w := io.NewOffsetWriter(t, off)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := io.ReadFull(src, buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return werr
			}
			bar.Add(int64(m))
		}
		// ReadFull returns these two unwrapped only for src's own io.EOF;
		// truncated data is the decoder's error, which wraps them.
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
