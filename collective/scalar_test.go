//go:build linux

package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// scalar returns a 0-d float64 tensor holding v, made as users make one:
// with a nil shape (FromBytes(dt, nil, b), as Zeros(dt) has) or an empty
// one.
func scalar(t testing.TB, v float64, nilShape bool) *tensordict.Tensor {
	t.Helper()
	var shape []int
	if !nilShape {
		shape = []int{}
	}
	x, err := tensordict.FromBytes(memmap.Float64, shape, binary.LittleEndian.AppendUint64(nil, math.Float64bits(v)))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func scalarOf(t testing.TB, x *tensordict.Tensor) float64 {
	t.Helper()
	if x == nil {
		t.Fatal("no tensor and no error")
	}
	if len(x.Shape()) != 0 {
		t.Fatalf("shape %v, want a 0-d tensor", x.Shape())
	}
	b, err := x.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// TestScalars: 0-d tensors (a loss, a count) through the collectives that
// take them, on every transport, with a nil shape and an empty one: every
// rank gets the right value, into a new tensor and in place, and the
// tape's gradient of an Allreduce of a loss is the sum of the ranks'
// seeds. (Before, a 0-d tensor with a nil shape, as FromBytes(dt, nil, b)
// and the Python client's sidecar make it, was taken for "no output" over
// TCP and in a hierarchy: AllreduceInto left each rank its own value and
// returned no error, and a data-parallel loss summed over Python ranks was
// wrong, so were its gradients.)
func TestScalars(t *testing.T) {
	type comms struct {
		name string
		make func(t *testing.T) []*Comm
	}
	transports := []comms{
		{"tcp", func(t *testing.T) []*Comm { return group(t, 3, TCP) }},
		{"shm", func(t *testing.T) []*Comm { return group(t, 3, SHM) }},
		{"hier", func(t *testing.T) []*Comm { return hierGroup(t, []int{0, 0, 1}, Hier) }},
	}
	for _, tr := range transports {
		for _, nilShape := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/nil-shape=%v", tr.name, nilShape), func(t *testing.T) {
				cs := tr.make(t)
				n := len(cs)
				in := func(c *Comm) float64 { return float64(10 + c.Rank()) }
				sum := 0.0
				for r := range n {
					sum += float64(10 + r)
				}
				cases := []struct {
					name string
					run  func(ctx context.Context, c *Comm) (*tensordict.Tensor, error)
					want func(r int) float64
				}{
					{"Allreduce", func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						return c.Allreduce(ctx, scalar(t, in(c), nilShape), Sum)
					}, func(int) float64 { return sum }},
					{"AllreduceInto/in-place", func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						x := scalar(t, in(c), nilShape)
						return x, c.AllreduceInto(ctx, x, x, Sum)
					}, func(int) float64 { return sum }},
					{"Allreduce/Max", func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						return c.Allreduce(ctx, scalar(t, in(c), nilShape), Max)
					}, func(int) float64 { return float64(10 + n - 1) }},
					{"ReduceInto/in-place", func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						x := scalar(t, in(c), nilShape)
						return x, c.ReduceInto(ctx, x, x, Sum, 1)
					}, func(r int) float64 {
						if r == 1 {
							return sum
						}
						return 0 // the others get zeros (ReduceInto's contract)
					}},
					{"BcastInto", func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						x := scalar(t, in(c), nilShape)
						return x, c.BcastInto(ctx, x, 2)
					}, func(int) float64 { return float64(10 + 2) }},
					{"Tape/Allreduce gradient", func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						tp := NewTape(c)
						x := tp.Leaf(scalar(t, in(c), nilShape))
						y, err := tp.Allreduce(ctx, x, Sum)
						if err != nil {
							return nil, err
						}
						if err := tp.Backward(ctx, y, scalar(t, 1, nilShape)); err != nil {
							return nil, err
						}
						return x.Grad(), nil
					}, func(int) float64 { return float64(n) }},
				}
				for _, tc := range cases {
					got := all(t, cs, tc.run)
					for r, y := range got {
						if v := scalarOf(t, y); v != tc.want(r) {
							t.Errorf("%s: rank %d got %v, want %v", tc.name, r, v, tc.want(r))
						}
					}
				}
			})
		}
	}
}
