package loader

import (
	"context"
	"math"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// image returns a uint8 tensor of one 1×3×4 image with pixels 1..12 (row
// major) and the batch holding it.
func oneImage(t *testing.T) *tensordict.TensorDict {
	t.Helper()
	px := make([]uint8, 12)
	for i := range px {
		px[i] = uint8(i + 1)
	}
	img, err := tensordict.FromSlice(px, 1, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	td, _ := tensordict.New(1)
	if err := td.Set("images", img); err != nil {
		t.Fatal(err)
	}
	return td
}

func TestAugment_Schema(t *testing.T) {
	in := tensordict.RowSchema{{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{3, 28, 28}}, {Key: []string{"labels"}, DType: memmap.Int64}}
	out, err := (&Augment{Pad: 4}).Schema(in)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].DType != memmap.Float32 || out[0].String() != "[images] torch.float32[3 28 28]" || out[1].String() != in[1].String() {
		t.Errorf("fields %v", out)
	}
	for _, tc := range []struct {
		name string
		a    Augment
		in   tensordict.RowSchema
	}{
		{"no such key", Augment{Key: []string{"x"}}, in},
		{"not uint8", Augment{}, tensordict.RowSchema{{Key: []string{"images"}, DType: memmap.Float32, Shape: []int{28, 28}}}},
		{"rank 1", Augment{}, tensordict.RowSchema{{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{784}}}},
		{"negative pad", Augment{Pad: -1}, in},
		{"negative std", Augment{Std: -1}, in},
		{"infinite std", Augment{Std: float32(math.Inf(1))}, in},
		{"NaN std", Augment{Std: float32(math.NaN())}, in},
		{"infinite mean", Augment{Mean: float32(math.Inf(1))}, in},
		{"NaN mean", Augment{Mean: float32(math.NaN())}, in},
	} {
		if _, err := tc.a.Schema(tc.in); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestAugment_Apply(t *testing.T) {
	src := oneImage(t)
	norm := func(v float32) float32 { return (v/255 - 0.5) / 0.25 }
	for _, tc := range []struct {
		name  string
		pad   int
		flip  bool
		check func(out []float32, dy, dx int, flip bool) bool
	}{
		{"normalize only", 0, false, nil},
		{"flip", 0, true, nil},
		{"crop", 2, false, nil},
		{"crop and flip", 2, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Augment{Pad: tc.pad, Flip: tc.flip, Mean: 0.5, Std: 0.25}
			schema, err := a.Schema(src.RowSchema())
			if err != nil {
				t.Fatal(err)
			}
			flips := map[bool]bool{}
			for first := range 64 {
				dst, _ := schema.Zeros(1)
				rows := &Rows{Epoch: 3, First: first, Index: []int{0}, seed: 11}
				if err := a.Apply(dst, src, rows); err != nil {
					t.Fatal(err)
				}
				// The same draws the transform made.
				rng := (&Rows{Epoch: 3, First: first, seed: 11}).Rand(0)
				dy, dx, flip := 0, 0, false
				if tc.pad > 0 {
					dy, dx = rng.IntN(2*tc.pad+1)-tc.pad, rng.IntN(2*tc.pad+1)-tc.pad
				}
				if tc.flip || tc.pad > 0 {
					flip = tc.flip && rng.IntN(2) == 1
				}
				flips[flip] = true
				got, _ := tensordict.Values[float32](mustTensor(dst, "images"))
				for y := range 3 {
					for x := range 4 {
						sx := x
						if flip {
							sx = 3 - x
						}
						sy, sx := y+dy, sx+dx
						want := norm(0)
						if sy >= 0 && sy < 3 && sx >= 0 && sx < 4 {
							want = norm(float32(sy*4 + sx + 1))
						}
						if g := got[y*4+x]; math.Abs(float64(g-want)) > 1e-6 {
							t.Fatalf("row at %d: pixel (%d,%d) = %v, want %v (dy %d dx %d flip %v)", first, y, x, g, want, dy, dx, flip)
						}
					}
				}
			}
			if tc.flip && len(flips) != 2 {
				t.Errorf("64 samples all flipped alike: %v", flips)
			}
		})
	}
}

// TestConsumer_SameAsLocal: consumers of a producer with a transform get
// bitwise the batches a Local loader of the same seed makes, whatever
// their batch size.
func TestConsumer_SameAsLocal(t *testing.T) {
	const n, seed = 90, 21
	aug := &Augment{Pad: 1, Flip: true, Mean: 0.3, Std: 0.2}
	// The producer runs the transform on 3 goroutines, the Local loader on
	// one: a sample is transformed alike whatever the split.
	f := newFixture(t, n, Config{Batch: 16, Slots: 3, Seed: seed, Transform: aug, IndexKey: "index", Workers: 3})
	for _, bytes := range []bool{false, true} {
		for _, b := range []int{5, 16, 48} {
			c := f.dial(t, b, bytes)
			l, err := NewLocal(Config{Dataset: f.dataset, Seed: seed, Transform: aug, IndexKey: "index"}, Options{Batch: b})
			if err != nil {
				t.Fatal(err)
			}
			// The Local loader's epochs count from 0; skip to the consumer's.
			for l.Epoch() < c.Epoch() {
				for range l.Batches(context.Background()) {
					break
				}
			}
			var want []*tensordict.TensorDict
			for batch, err := range l.Batches(context.Background()) {
				if err != nil {
					t.Fatal(err)
				}
				cl, _ := batch.Clone()
				want = append(want, cl)
			}
			l.Close()
			i := 0
			for batch, err := range c.Batches(context.Background()) {
				if err != nil {
					t.Fatal(err)
				}
				if i >= len(want) || !batch.Equal(want[i]) {
					t.Fatalf("bytes=%v batch %d: batch %d differs from the Local loader's", bytes, b, i)
				}
				i++
			}
			if i != len(want) {
				t.Errorf("bytes=%v batch %d: %d batches, the Local loader %d", bytes, b, i, len(want))
			}
			c.Close()
		}
	}
}
