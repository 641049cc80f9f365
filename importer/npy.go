package importer

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/tensorwire/tensorwire/internal/npy"
	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/tensordict"
)

// File names a NumPy .npy file to import at a key: Key holds one element
// per level of nesting ({"next", "reward"} for the tensor "reward" of the
// nested TensorDict "next").
type File struct {
	Key  []string
	Path string
}

// NPY builds a dataset at prefix with one tensor per .npy file, of the
// file's dtype and shape, in the order given. All arrays must share their
// first dimension N, which becomes the batch size [N]; each key may be given
// once, and not both as a tensor and as a folder of tensors. It returns N.
//
// Errors wrap ErrExists or ErrNotReplaceable for the prefix, ErrInvalid for
// files that do not fit together (naming the key or the file), ErrFormat and
// ErrUnsupported for a file (naming it), or the context's error. A failed
// import creates nothing at prefix and changes nothing that was there.
func NPY(ctx context.Context, prefix string, files []File, opts Options) (int, error) {
	n, err := importNPY(ctx, prefix, files, opts)
	if err != nil {
		return 0, fmt.Errorf("import npy into %s: %w", prefix, err)
	}
	return n, nil
}

func importNPY(ctx context.Context, prefix string, files []File, opts Options) (int, error) {
	if len(files) == 0 {
		return 0, fmt.Errorf("%w: no .npy files", ErrInvalid)
	}
	if err := checkKeys(files); err != nil {
		return 0, err
	}
	if _, err := prepare(prefix, opts); err != nil {
		return 0, err
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
			return 0, classify(err)
		}
		rs = append(rs, r)
		h := r.Header()
		if len(h.Shape) == 0 {
			return 0, fmt.Errorf("%w: %s: a scalar has no rows to share a batch dimension", ErrInvalid, f.Path)
		}
		if n >= 0 && h.Shape[0] != n {
			return 0, fmt.Errorf("%w: %s has %d rows, %s has %d: arrays must share their first dimension",
				ErrInvalid, f.Path, h.Shape[0], files[0].Path, n)
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
	return n, err
}

// checkKeys refuses a key given twice, and a key given both for a tensor and
// as the folder of another ("obs" and "obs/x"): either would leave one file
// out of the dataset.
func checkKeys(files []File) error {
	for i, f := range files {
		if len(f.Key) == 0 {
			return fmt.Errorf("%w: %s has an empty key", ErrInvalid, f.Path)
		}
		for _, g := range files[:i] {
			k := min(len(f.Key), len(g.Key))
			if !slices.Equal(f.Key[:k], g.Key[:k]) {
				continue
			}
			key := fmt.Sprintf("%q", strings.Join(f.Key[:k], "/"))
			if len(f.Key) == len(g.Key) {
				return fmt.Errorf("%w: key %s is given twice (%s and %s)", ErrInvalid, key, g.Path, f.Path)
			}
			return fmt.Errorf("%w: key %s is given both as a tensor and as a folder of tensors (%s and %s)", ErrInvalid, key, g.Path, f.Path)
		}
	}
	return nil
}
