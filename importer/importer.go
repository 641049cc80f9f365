package importer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
	"github.com/tensorwire/tensorwire/internal/idx"
	"github.com/tensorwire/tensorwire/internal/npy"
	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Options control an import. The zero value imports quietly and refuses an
// existing prefix.
type Options struct {
	// Force replaces an existing dataset (or empty folder) at the prefix.
	// It never replaces anything else: see the package documentation.
	Force bool
	// Progress, if not nil, receives a progress bar of the bytes read:
	// redrawn in place on a terminal, a line every few seconds otherwise,
	// and a final line when the import ends.
	Progress io.Writer
}

// rename is os.Rename; tests replace it to make a rename fail.
var rename = os.Rename

// prepare checks what is at prefix before any work: nothing, or a dataset
// Force may replace and Force is set. It returns whether something is
// there.
func prepare(prefix string, opts Options) (bool, error) {
	exists, err := checkPrefix(prefix)
	if err != nil {
		return false, err
	}
	if exists && !opts.Force {
		what := "holds a dataset"
		if entries, err := os.ReadDir(prefix); err == nil && len(entries) == 0 {
			what = "is an empty folder"
		}
		return false, fmt.Errorf("%w: %s %s", ErrExists, prefix, what)
	}
	return exists, nil
}

// build creates storage for batch and fields in a temporary folder next to
// prefix, runs fill on it, flushes it and puts it at prefix (install). fill
// counts the total bytes it reads into bar, which is nil without
// opts.Progress. The caller has checked prefix with prepare.
func build(ctx context.Context, prefix string, opts Options, batch []int, fields []tensordict.Field, total int64,
	fill func(td *tensordict.TensorDict, bar *progress.Bar) error) error {
	var bar *progress.Bar
	if opts.Progress != nil {
		bar = progress.New(opts.Progress, "import", "B", total)
		defer bar.Done()
	}
	clean := filepath.Clean(prefix)
	parent := filepath.Dir(clean)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(clean)+".importing-*")
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
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return install(clean, tmp, opts)
}

// install renames the complete dataset tmp to prefix. A dataset already at
// prefix (checked again now: the import may have taken minutes) is renamed
// aside first, checked once more where it is now, where nobody else looks,
// and removed only once tmp is in place; if tmp cannot be renamed in, it is
// renamed back.
func install(prefix, tmp string, opts Options) error {
	parent := filepath.Dir(prefix)
	exists, err := prepare(prefix, opts)
	if err != nil {
		return err
	}
	aside := ""
	if exists {
		aside = tmp + ".old"
		if err := rename(prefix, aside); err != nil {
			return fmt.Errorf("moving the old dataset aside: %w", err)
		}
		if err := checkDataset(aside, "", true); err != nil {
			if rerr := rename(aside, prefix); rerr != nil {
				return fmt.Errorf("%w %s: %v; and moving it back from %s: %w", ErrNotReplaceable, prefix, err, aside, rerr)
			}
			return fmt.Errorf("%w %s: %v", ErrNotReplaceable, prefix, err)
		}
	}
	if err := rename(tmp, prefix); err != nil {
		if aside != "" {
			if rerr := rename(aside, prefix); rerr != nil {
				return fmt.Errorf("%w; and moving the old dataset back from %s: %w", err, aside, rerr)
			}
		}
		return err
	}
	if err := atomicfile.SyncDir(parent); err != nil { // the rename survives a crash once the import returns
		return err
	}
	if aside != "" {
		if err := os.RemoveAll(aside); err != nil {
			return fmt.Errorf("the new dataset is in place, but removing the old one at %s: %w", aside, err)
		}
	}
	return nil
}

// inputError marks a decoder's error as one of the package's sentinels
// (ErrFormat, ErrUnsupported) without changing its message.
type inputError struct {
	err, kind error
}

func (e *inputError) Error() string   { return e.err.Error() }
func (e *inputError) Unwrap() []error { return []error{e.kind, e.err} }

// classify wraps a decoder's malformed-file and unsupported-input errors so
// that they match ErrFormat and ErrUnsupported; it returns others as they
// are.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, idx.ErrFormat), errors.Is(err, npy.ErrFormat):
		return &inputError{err, ErrFormat}
	case errors.Is(err, npy.ErrUnsupported):
		return &inputError{err, ErrUnsupported}
	}
	return err
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
			return classify(err)
		}
	}
}
