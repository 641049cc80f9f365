package importer

import (
	"context"
	"fmt"
	"strings"

	"github.com/tensorwire/tensorwire/internal/npy"
	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/tensordict"
)

// File names a NumPy .npy file to import at a (nested) key.
type File struct {
	Key  []string
	Path string
}

// ParseFile parses the CLI form key=FILE.npy, nested keys joined by "/".
func ParseFile(s string) (File, error) {
	k, p, ok := strings.Cut(s, "=")
	if !ok || k == "" || p == "" {
		return File{}, fmt.Errorf("%q is not key=FILE.npy", s)
	}
	return File{Key: strings.Split(k, "/"), Path: p}, nil
}

// NPY builds a dataset at prefix with one tensor per .npy file, of the
// file's dtype and shape. All arrays must share their first dimension N,
// which becomes the batch size [N]. It returns N.
func NPY(ctx context.Context, prefix string, files []File, opts Options) (int, error) {
	if len(files) == 0 {
		return 0, fmt.Errorf("import npy: no key=FILE.npy arguments")
	}
	var rs []*npy.ReadCloser
	defer func() {
		for _, r := range rs {
			r.Close()
		}
	}()
	var fields []tensordict.Field
	n := -1
	var total int64
	for _, f := range files {
		r, err := npy.Open(f.Path)
		if err != nil {
			return 0, err
		}
		rs = append(rs, r)
		h := r.Header()
		if len(h.Shape) == 0 {
			return 0, fmt.Errorf("%s: a scalar has no rows to share a batch dimension", f.Path)
		}
		if n >= 0 && h.Shape[0] != n {
			return 0, fmt.Errorf("%s has %d rows, %s has %d: arrays must share their first dimension", f.Path, h.Shape[0], files[0].Path, n)
		}
		n = h.Shape[0]
		fields = append(fields, tensordict.Field{Key: f.Key, DType: h.DType, Shape: h.Shape})
		total += h.NumBytes()
	}
	err := build(ctx, prefix, opts, []int{n}, fields, total, func(td *tensordict.TensorDict, bar *progress.Bar) error {
		for i, r := range rs {
			t, err := td.Tensor(files[i].Key...)
			if err != nil {
				return err
			}
			if err := copyInto(ctx, t, 0, r, bar); err != nil {
				return fmt.Errorf("%s: %w", files[i].Path, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("import npy into %s: %w", prefix, err)
	}
	return n, nil
}
