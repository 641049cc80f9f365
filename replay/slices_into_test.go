package replay

import (
	"context"
	"errors"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

// TestSampleSlicesInto: slices sampled into a batch the caller holds,
// filled with garbage first (as a batch a training step wrote over is),
// in a process's buffer and through a node by reference and by bytes: the
// batch holds whole slices afterwards, its padding rows zeroed, and the
// caller's own TensorDict is the one written. A batch of another size is
// ErrArgument, and leaves it as it was.
func TestSampleSlicesInto(t *testing.T) {
	type sampler interface {
		SampleSlicesInto(ctx context.Context, spec SliceSpec, dst *tensordict.TensorDict) (SliceInfo, error)
		Extend(ctx context.Context, td *tensordict.TensorDict) ([]int, error)
	}
	run := func(t *testing.T, s sampler) {
		ctx := ctxT(t)
		for ep := int64(1); ep <= 6; ep++ {
			if _, err := s.Extend(ctx, steps(t, ep, 0, int(ep)*2)); err != nil {
				t.Fatal(err)
			}
		}
		for _, spec := range []SliceSpec{{SliceLen: 5, NumSlices: 32, PadShort: true}, {SliceLen: 3, NumSlices: 16}} {
			dst, err := stepSchema.Zeros(spec.SliceLen * spec.NumSlices)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				for _, leaf := range dst.Leaves() {
					b, _ := leaf.Bytes()
					for i := range b {
						b[i] = 0xff
					}
				}
				info, err := s.SampleSlicesInto(ctx, spec, dst)
				if err != nil {
					t.Fatal(err)
				}
				if err := checkSlices(info, dst, spec); err != nil {
					t.Fatalf("%+v: %v", spec, err)
				}
			}
		}
		spec := SliceSpec{SliceLen: 5, NumSlices: 4}
		dst, err := stepSchema.Zeros(19)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.SampleSlicesInto(ctx, spec, dst); !errors.Is(err, ErrArgument) {
			t.Fatalf("19 rows for 4 slices of 5: %v, want ErrArgument", err)
		}
		if eps, _, _ := stepsOf(dst); eps[0] != 0 {
			t.Fatal("a refused batch was written")
		}
	}
	t.Run("buffer", func(t *testing.T) {
		run(t, create(t, Config{Capacity: 40, Schema: stepSchema, TrajKey: []string{"episode"}}))
	})
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 40, TrajKey: []string{"episode"}})
			run(t, dialBuffer(t, n.addr, "buf", root, mode))
		})
	}
}
