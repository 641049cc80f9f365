package importer

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/tensorwire/tensorwire/internal/idx"
	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Pair names an IDX images file and its labels file, each gzipped or not
// (detected by its first bytes).
type Pair struct {
	Images, Labels string
}

// IDX builds a dataset at prefix from IDX image/label pairs (the MNIST
// family): "images" uint8 [N, H, W] and "labels" int64 [N], batch size [N],
// the pairs' rows concatenated in order. Every pair must hold uint8 images of
// the same H and W and as many integer labels as images. It returns N.
//
// Errors wrap ErrExists or ErrNotReplaceable for the prefix, ErrInvalid for
// pairs that do not fit together, ErrFormat and ErrUnsupported for a file
// (naming it), or the context's error. A failed import creates nothing at
// prefix and changes nothing that was there.
func IDX(ctx context.Context, prefix string, pairs []Pair, opts Options) (int, error) {
	n, err := importIDX(ctx, prefix, pairs, opts)
	if err != nil {
		return 0, fmt.Errorf("import idx into %s: %w", prefix, err)
	}
	return n, nil
}

func importIDX(ctx context.Context, prefix string, pairs []Pair, opts Options) (int, error) {
	if len(pairs) == 0 {
		return 0, fmt.Errorf("%w: no image/label pairs", ErrInvalid)
	}
	if _, err := prepare(prefix, opts); err != nil {
		return 0, err
	}
	var imgs, lbls []*idx.ReadCloser
	defer func() {
		for _, r := range append(imgs, lbls...) {
			r.Close()
		}
	}()
	var n int
	var hw []int
	var total int64
	for _, p := range pairs {
		im, err := idx.Open(p.Images)
		if err != nil {
			return 0, classify(err)
		}
		imgs = append(imgs, im)
		lb, err := idx.Open(p.Labels)
		if err != nil {
			return 0, classify(err)
		}
		lbls = append(lbls, lb)
		ih, lh := im.Header(), lb.Header()
		switch {
		case ih.DType != memmap.Uint8 || len(ih.Shape) != 3:
			return 0, fmt.Errorf("%w: %s: images must be uint8 [N, H, W], not %v %v", ErrUnsupported, p.Images, ih.DType, ih.Shape)
		case len(lh.Shape) != 1 || !lh.DType.Real() || lh.DType == memmap.Float32 || lh.DType == memmap.Float64:
			return 0, fmt.Errorf("%w: %s: labels must be integers [N], not %v %v", ErrUnsupported, p.Labels, lh.DType, lh.Shape)
		case lh.Shape[0] != ih.Shape[0]:
			return 0, fmt.Errorf("%w: %s has %d labels for the %d images of %s", ErrInvalid, p.Labels, lh.Shape[0], ih.Shape[0], p.Images)
		case hw != nil && !slices.Equal(hw, ih.Shape[1:]):
			return 0, fmt.Errorf("%w: %s: images of %v, the first pair's are %v", ErrInvalid, p.Images, ih.Shape[1:], hw)
		}
		hw = ih.Shape[1:]
		n += ih.Shape[0]
		total += ih.NumBytes() + lh.NumBytes()
	}
	fields := []tensordict.Field{
		{Key: []string{"images"}, DType: memmap.Uint8, Shape: append([]int{n}, hw...)},
		{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{n}},
	}
	err := build(ctx, prefix, opts, []int{n}, fields, total, func(td *tensordict.TensorDict, bar *progress.Bar) error {
		images, err := td.Tensor("images")
		if err != nil {
			return err
		}
		labels, err := td.Tensor("labels")
		if err != nil {
			return err
		}
		row := 0
		for i, im := range imgs {
			if err := copyInto(ctx, images, int64(row*images.RowBytes()), im, bar); err != nil {
				return fmt.Errorf("%s: %w", pairs[i].Images, err)
			}
			if err := copyLabels(labels, row, lbls[i], bar); err != nil {
				return fmt.Errorf("%s: %w", pairs[i].Labels, err)
			}
			row += im.Header().Shape[0]
		}
		return nil
	})
	return n, err
}

// copyLabels converts a labels file to int64 rows of labels from row start.
// The file is small (a few bytes per image) and read whole.
func copyLabels(labels *tensordict.Tensor, start int, r *idx.ReadCloser, bar *progress.Bar) error {
	h := r.Header()
	raw, err := io.ReadAll(bar.Reader(r)) // exactly h.NumBytes() when err is nil
	if err != nil {
		return classify(err)
	}
	out := make([]int64, h.Shape[0])
	size := h.DType.Size()
	for i := range out {
		out[i] = int64(h.DType.Float64(raw[i*size:]))
	}
	t, err := tensordict.FromSlice(out)
	if err != nil {
		return err
	}
	return labels.SetSlice(start, t)
}
