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
// prefix, runs fill on it, flushes it and renames it to prefix.
func build(ctx context.Context, prefix string, opts Options, batch []int, fields []tensordict.Field,
	fill func(td *tensordict.TensorDict) error) error {
	if _, err := os.Lstat(prefix); err == nil && !opts.Force {
		return fmt.Errorf("%w: %s (use --force to replace it)", ErrExists, prefix)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
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
	err = fill(td)
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
	return nil
}

// copyInto streams src into t from byte offset off, counting into bar and
// stopping when ctx is done. It returns the bytes copied.
func copyInto(ctx context.Context, t *tensordict.Tensor, off int64, src io.Reader, n int64, bar *progress.Bar) (int64, error) {
	buf := make([]byte, 1<<20)
	w := io.NewOffsetWriter(t, off)
	var done int64
	for done < n {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		m, err := io.ReadFull(src, buf[:min(int64(len(buf)), n-done)])
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return done, werr
			}
			done += int64(m)
			bar.Add(int64(m))
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}
