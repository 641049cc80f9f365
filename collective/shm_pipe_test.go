//go:build linux

package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestShm_PipelinedReduce: Allreduce and Reduce of tensors of several
// chunks (the last one short, shares of unequal length) through shared
// mappings, in place and not, over 2 to 4 ranks: every rank gets exactly
// the rank-order reduction (the bits of reducing the ranks' tensors left
// to right), and Reduce's other ranks zeros.
func TestShm_PipelinedReduce(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := group(t, n, SHM)
			for _, tc := range []struct {
				dt     memmap.DType
				op     Op
				chunks int // whole chunks before a short one
			}{
				{memmap.Float32, Sum, 2},
				{memmap.Float64, Sum, 1},
				{memmap.Int64, Sum, 3},
				{memmap.Uint8, Max, 2},
			} {
				es := tc.dt.Size()
				per := n * (pipeShare / es)
				elems := tc.chunks*per + per/2 + 3
				for _, inPlace := range []bool{false, true} {
					for _, root := range []int{-1, n - 1} { // -1: Allreduce
						name := fmt.Sprintf("%v/%v/%d elems/in place %v/root %d", tc.dt, tc.op, elems, inPlace, root)
						t.Run(name, func(t *testing.T) {
							rng := rand.New(rand.NewPCG(uint64(n), uint64(elems)))
							xs := make([]*tensordict.Tensor, n)
							srcs := make([][]byte, n)
							for r := range n {
								xs[r] = randTensor(t, rng, tc.dt, elems)
								srcs[r] = bytes.Clone(must1(xs[r].Bytes()))
							}
							want := make([]byte, len(srcs[0]))
							for i := 0; i < len(want); i += 1 << 16 {
								e := min(i+1<<16, len(want))
								part := make([][]byte, n)
								for r := range n {
									part[r] = srcs[r][i:e]
								}
								foldRef(tc.op, tc.dt, want[i:e], part)
							}
							got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
								x := xs[c.Rank()]
								switch {
								case root < 0 && inPlace:
									return x, c.AllreduceInto(ctx, x, x, tc.op)
								case root < 0:
									return c.Allreduce(ctx, x, tc.op)
								case inPlace:
									return x, c.ReduceInto(ctx, x, x, tc.op, root)
								}
								return c.Reduce(ctx, x, tc.op, root)
							})
							for r, g := range got {
								b := must1(g.Bytes())
								w := want
								if root >= 0 && r != root {
									w = make([]byte, len(want))
								}
								if !bytes.Equal(b, w) {
									i := 0
									for i < len(b) && b[i] == w[i] {
										i++
									}
									t.Fatalf("rank %d: byte %d (chunk %d) differs from the rank-order reduction", r, i, i/(per*es))
								}
							}
						})
					}
				}
			}
		})
	}
}

// foldRef reduces srcs into dst left to right, one pair at a time: the
// reference the pipelined reduction must match bit for bit.
func foldRef(op Op, dt memmap.DType, dst []byte, srcs [][]byte) {
	copy(dst, srcs[0])
	for _, s := range srcs[1:] {
		reduceN(op, dt, dst, [][]byte{dst, s})
	}
}
