package loader

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"unsafe"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Transform changes rows on their way from the dataset to the batches, as
// the transforms of an image dataset do (decode, augment, normalize). The
// producer runs it once per sample for every consumer; a Local loader runs
// it itself.
//
// A Transform is used by one goroutine at a time.
type Transform interface {
	// Schema returns the row schema of the output for input rows of
	// schema in, or an error if it cannot transform such rows (the
	// producer then refuses the dataset with ErrDataset).
	Schema(in tensordict.RowSchema) (tensordict.RowSchema, error)

	// Apply writes into dst the transformed rows of src: row i of dst
	// from row i of src. dst has the schema Schema returned and as many
	// rows as src; it holds stale data, so Apply writes every element.
	// rows says which samples they are and gives each its random source.
	// src and dst are valid only during the call: dst is often a view of
	// the producer's ring.
	Apply(dst, src *tensordict.TensorDict, rows *Rows) error
}

// ConcurrentTransform is a Transform whose Apply may run on several
// goroutines at once, each on rows of its own (Config.Workers): it keeps
// no state between calls, or guards it.
type ConcurrentTransform interface {
	Transform
	// Concurrent reports whether Apply may run concurrently.
	Concurrent() bool
}

// Rows describes the samples a Transform works on.
type Rows struct {
	// Epoch is the epoch the samples are served in.
	Epoch int64
	// First is the position of row 0 in the epoch's order: row i is the
	// epoch's sample First+i.
	First int
	// Index holds each row's index in the dataset.
	Index []int

	seed uint64
	pcg  rand.PCG
	rng  *rand.Rand
}

// Rand returns the random source of row i. It depends only on the
// producer's seed, the epoch and the sample's position in the epoch, so
// a sample is transformed alike by a producer and by a Local loader with
// the same seed, whatever their batch sizes. It is the same *rand.Rand at
// each call, reseeded: draw row i's numbers before asking for another
// row's.
func (r *Rows) Rand(i int) *rand.Rand {
	if r.rng == nil {
		r.rng = rand.New(&r.pcg)
	}
	r.pcg.Seed(r.seed^mix(uint64(r.Epoch)), mix(uint64(r.First+i)))
	return r.rng
}

// Augment is the transform image loaders run on every sample, as
// torchvision's RandomCrop(size, padding=Pad), RandomHorizontalFlip(),
// ToTensor() and Normalize(Mean, Std) do: the image padded with Pad zeros
// on each side and cropped back to its size at a random offset, flipped
// left to right with probability 1/2 when Flip is set, then scaled to
// [0, 1] and normalized, (x/255 - Mean) / Std, into float32.
//
// The image is the field at Key (default "images"): uint8 of row shape
// [H, W] or [C, H, W]; it becomes float32 of the same shape. Other fields
// pass through unchanged.
type Augment struct {
	Key  []string
	Pad  int
	Flip bool
	Mean float32
	Std  float32 // 0 means 1
}

func (a *Augment) key() []string {
	if len(a.Key) == 0 {
		return []string{"images"}
	}
	return a.Key
}

// Concurrent implements ConcurrentTransform: Apply only reads a.
func (a *Augment) Concurrent() bool { return true }

// Schema implements Transform.
func (a *Augment) Schema(in tensordict.RowSchema) (tensordict.RowSchema, error) {
	if a.Pad < 0 {
		return nil, fmt.Errorf("augment: negative padding %d", a.Pad)
	}
	if !(a.Std >= 0) || math.IsInf(float64(a.Std), 0) {
		return nil, fmt.Errorf("augment: std %v: want a positive finite number (or 0 for 1)", a.Std)
	}
	if math.IsNaN(float64(a.Mean)) || math.IsInf(float64(a.Mean), 0) {
		return nil, fmt.Errorf("augment: mean %v: want a finite number", a.Mean)
	}
	out := in.Clone()
	found := false
	for i, f := range in {
		if !slices.Equal(f.Key, a.key()) {
			continue
		}
		found = true
		if f.DType != memmap.Uint8 {
			return nil, fmt.Errorf("augment: %s is %v, want uint8 images", strings.Join(f.Key, "/"), f.DType)
		}
		if r := len(f.Shape); r != 2 && r != 3 {
			return nil, fmt.Errorf("augment: %s has rows of shape %v, want [H W] or [C H W]", strings.Join(f.Key, "/"), f.Shape)
		}
		out[i].DType = memmap.Float32
	}
	if !found {
		return nil, fmt.Errorf("augment: no field %s", strings.Join(a.key(), "/"))
	}
	return out, nil
}

// Apply implements Transform.
func (a *Augment) Apply(dst, src *tensordict.TensorDict, rows *Rows) error {
	key := a.key()
	for path, st := range src.Leaves() {
		dt, err := dst.Tensor(path...)
		if err != nil {
			return err
		}
		if !slices.Equal(path, key) {
			if err := dt.SetSlice(0, st); err != nil {
				return fmt.Errorf("augment: %s: %w", strings.Join(path, "/"), err)
			}
			continue
		}
		if err := a.images(dt, st, rows); err != nil {
			return err
		}
	}
	return nil
}

// images transforms the image rows of src into dst.
func (a *Augment) images(dst, src *tensordict.Tensor, rows *Rows) error {
	in, err := src.Bytes()
	if err != nil {
		return err
	}
	raw, err := dst.Bytes()
	if err != nil {
		return err
	}
	shape := src.Shape()
	n, c, h, w := shape[0], 1, shape[len(shape)-2], shape[len(shape)-1]
	if len(shape) == 4 {
		c = shape[1]
	}
	if len(raw) != len(in)*4 || len(raw)%4 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%4 != 0 {
		return fmt.Errorf("augment: output of %d bytes for %d pixels", len(raw), len(in))
	}
	out := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(raw))), len(in))
	std := a.Std
	if std == 0 {
		std = 1
	}
	var lut [256]float32
	for v := range lut {
		lut[v] = (float32(v)/255 - a.Mean) / std
	}
	zero := lut[0]
	plane := h * w
	for i := range n {
		dy, dx, flip := 0, 0, false
		if a.Pad > 0 || a.Flip {
			rng := rows.Rand(i)
			if a.Pad > 0 {
				dy, dx = rng.IntN(2*a.Pad+1)-a.Pad, rng.IntN(2*a.Pad+1)-a.Pad
			}
			flip = a.Flip && rng.IntN(2) == 1
		}
		for ch := range c {
			sp := in[(i*c+ch)*plane : (i*c+ch+1)*plane]
			dp := out[(i*c+ch)*plane : (i*c+ch+1)*plane]
			for y := range h {
				sy := y + dy
				drow := dp[y*w : (y+1)*w]
				if sy < 0 || sy >= h {
					for x := range drow {
						drow[x] = zero
					}
					continue
				}
				srow := sp[sy*w : (sy+1)*w]
				for x := range drow {
					sx := x
					if flip {
						sx = w - 1 - x
					}
					sx += dx
					if sx < 0 || sx >= w {
						drow[x] = zero
					} else {
						drow[x] = lut[srow[sx]]
					}
				}
			}
		}
	}
	return nil
}
