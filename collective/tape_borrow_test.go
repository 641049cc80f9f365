package collective

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestTape_BorrowsWithoutWriting: the tape copies no gradient, and so
// borrows the caller's seed and the tensors a Func's adjoint returns: it
// never writes them (Allreduce's adjoint, which reduces a gradient of its
// own in place, reduces a borrowed one into a new tensor), never hands
// one back as a leaf's Grad, and never lets two Vars share one.
func TestTape_BorrowsWithoutWriting(t *testing.T) {
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			comms := group(t, 3, tr)
			const elems = 70_000 // over 64 KiB: the large algorithms
			seeds := make([]*tensordict.Tensor, 3)
			held := make([]*tensordict.Tensor, 3)
			for r := range 3 {
				seeds[r] = filled(t, elems, float64(r+1))
				held[r] = filled(t, elems, 2)
			}
			all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
				r := c.Rank()
				// The caller's seed into Allreduce's adjoint.
				tp := NewTape(c)
				x := tp.Leaf(filled(t, elems, 1))
				y, err := tp.Allreduce(ctx, x, Sum)
				if err != nil {
					return 0, err
				}
				before := clone(t, seeds[r])
				if err := tp.Backward(ctx, y, seeds[r]); err != nil {
					return 0, err
				}
				if err := same(seeds[r], before); err != nil {
					return 0, fmt.Errorf("the seed was written: %v", err)
				}
				if err := isAll(x.Grad(), 1+2+3); err != nil {
					return 0, fmt.Errorf("the gradient through Allreduce: %v", err)
				}

				// A Func's gradient (a tensor it keeps) into Allreduce's
				// adjoint.
				tp = NewTape(c)
				x = tp.Leaf(filled(t, elems, 1))
				if y, err = tp.Allreduce(ctx, x, Sum); err != nil {
					return 0, err
				}
				z := tp.Func("keep", []*Var{y}, []*tensordict.Tensor{y.Value()}, func(_ context.Context, _ []*tensordict.Tensor) ([]*tensordict.Tensor, error) {
					return []*tensordict.Tensor{held[r]}, nil
				})
				if err := tp.Backward(ctx, z[0], nil); err != nil {
					return 0, err
				}
				if err := isAll(held[r], 2); err != nil {
					return 0, fmt.Errorf("the Func's tensor was written: %v", err)
				}
				if err := isAll(x.Grad(), 3*2); err != nil {
					return 0, fmt.Errorf("the gradient through the Func and Allreduce: %v", err)
				}

				// One tensor to two leaves, and the caller's seed straight
				// to a leaf.
				tp = NewTape(c)
				a, b := tp.Leaf(filled(t, 4, 1)), tp.Leaf(filled(t, 4, 1))
				w := tp.Func("pair", []*Var{a, b}, []*tensordict.Tensor{filled(t, 4, 0)}, func(_ context.Context, g []*tensordict.Tensor) ([]*tensordict.Tensor, error) {
					return []*tensordict.Tensor{g[0], g[0]}, nil
				})
				seed := filled(t, 4, 5)
				if err := tp.Backward(ctx, w[0], seed); err != nil {
					return 0, err
				}
				ab, _ := a.Grad().Bytes()
				bb, _ := b.Grad().Bytes()
				sb, _ := seed.Bytes()
				if &ab[0] == &bb[0] || &ab[0] == &sb[0] || &bb[0] == &sb[0] {
					return 0, fmt.Errorf("two leaves, or a leaf and the seed, share a gradient")
				}
				if err := isAll(a.Grad(), 5); err != nil {
					return 0, err
				}
				return 0, isAll(b.Grad(), 5)
			})
		})
	}
}

func filled(t testing.TB, n int, v float64) *tensordict.Tensor {
	t.Helper()
	x, err := tensordict.Zeros(memmap.Float64, n)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := x.Bytes()
	s := as[float64](b)
	for i := range s {
		s[i] = v
	}
	return x
}

func clone(t testing.TB, x *tensordict.Tensor) *tensordict.Tensor {
	t.Helper()
	c, err := x.Clone()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func same(a, b *tensordict.Tensor) error {
	ab, _ := a.Bytes()
	bb, _ := b.Bytes()
	if !bytes.Equal(ab, bb) {
		return fmt.Errorf("the bytes differ")
	}
	return nil
}

func isAll(x *tensordict.Tensor, v float64) error {
	if x == nil {
		return fmt.Errorf("no tensor")
	}
	b, _ := x.Bytes()
	for i, e := range as[float64](b) {
		if e != v {
			return fmt.Errorf("element %d is %v, want %v", i, e, v)
		}
	}
	return nil
}
