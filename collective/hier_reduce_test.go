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

// Reduce and ReduceScatter of a hierarchical communicator (hier_reduce.go)
// against the plain computation in the hierarchy's order, and, where the
// order does not matter (Max), the flat algorithms' bits.

// hierOrder reduces xs (every rank's input bytes) with op as a hierarchy
// of grouping hosts documents: each host's ranks ascending, then the
// hosts' partials in host order, one pair at a time.
func hierOrder(op Op, dt memmap.DType, hosts []int, xs [][]byte) []byte {
	fold := func(bs [][]byte) []byte {
		acc := bytes.Clone(bs[0])
		for _, b := range bs[1:] {
			reduceN(op, dt, acc, [][]byte{acc, b})
		}
		return acc
	}
	var parts [][]byte
	for _, th := range topologyOf(hosts).Hosts {
		var mine [][]byte
		for _, r := range th.Ranks {
			mine = append(mine, xs[r])
		}
		parts = append(parts, fold(mine))
	}
	return fold(parts)
}

// bigCounts are uneven pieces of ReduceScatter rows of 4000 bytes: 1.6 MB
// a piece.
var bigCounts = []int{401, 400, 403, 399, 402}

func sumInts(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// TestHier_ReductionsInHierarchyOrder runs Reduce to every root and
// ReduceScatter (uneven and empty pieces, several axes, dtypes, Sum and
// Max, small and in 1 MiB pieces, in place and into a given output),
// three rounds with an Allreduce between (the host's file sets and
// phases in both parities), on every layout: the root's (every rank's)
// result has the bits of the plain computation in the hierarchy's order,
// the other ranks of a Reduce get zeros, and a Max (whose order does not
// matter) has the bits a TCP communicator gives.
func TestHier_ReductionsInHierarchyOrder(t *testing.T) {
	runHierTable(t, 30, func(t *testing.T, hosts []int, rng *rand.Rand) []hierCase {
		n := len(hosts)
		var cases []hierCase
		inputs := func(dt memmap.DType, shape []int) ([]*tensordict.Tensor, [][]byte) {
			xs := make([]*tensordict.Tensor, n)
			bs := make([][]byte, n)
			for r := range n {
				xs[r] = randTensor(t, rng, dt, shape...)
				bs[r] = tbytes(t, xs[r])
			}
			return xs, bs
		}
		for _, rc := range []struct {
			dt    memmap.DType
			op    Op
			shape []int
		}{
			{memmap.Float64, Sum, []int{3, 5}},
			{memmap.Float64, Sum, []int{1}}, // fewer elements than a host's ranks
			{memmap.Float32, Sum, []int{0, 4}},
			{memmap.Float32, Sum, []int{300_001}}, // 1.2 MB: pieces of 1 MiB
			{memmap.Int32, Max, []int{7, 3}},
		} {
			xs, bs := inputs(rc.dt, rc.shape)
			sum := hierOrder(rc.op, rc.dt, hosts, bs)
			for _, root := range testRoots(hosts) {
				want := make([][]byte, n)
				for r := range n {
					want[r] = make([]byte, len(sum))
				}
				want[root] = sum
				name := fmt.Sprintf("Reduce %v %s %v root %d", rc.op, rc.dt.Name(), rc.shape, root)
				cases = append(cases, hierCase{name, xs, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					return c.Reduce(ctx, x, rc.op, root)
				}, want, rc.op == Max})
				cases = append(cases, hierCase{name + " in place", xs, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					y, _ := tensordict.Zeros(x.DType(), x.Shape()...)
					copy(tbytes(t, y), tbytes(t, x))
					return y, c.ReduceInto(ctx, y, y, rc.op, root)
				}, want, rc.op == Max})
			}
		}
		for _, rc := range []struct {
			dt     memmap.DType
			op     Op
			axis   int
			shape  []int
			counts []int
			into   bool
		}{
			{memmap.Float64, Sum, 1, []int{2, 6, 3}, []int{0, 3, 2, 1, 0}[:n], false}, // empty pieces
			{memmap.Float64, Sum, 2, []int{2, 3, tri(n)}, unevenCounts(n), true},
			{memmap.Float32, Sum, 0, []int{sumInts(bigCounts[:n]), 1000}, bigCounts[:n], false}, // 1.6 MB a piece
			{memmap.Int16, Max, 0, []int{4 * n, 3}, nil, true},
			{memmap.Float32, Max, 1, []int{3, 2 * n}, nil, false},
		} {
			counts := rc.counts
			if counts == nil {
				counts = evenCounts(rc.shape[rc.axis], n)
			}
			xs, bs := inputs(rc.dt, rc.shape)
			sum := hierOrder(rc.op, rc.dt, hosts, bs)
			es := rc.dt.Size()
			pre := prefix(counts)
			want := make([][]byte, n)
			for r := range n {
				box := along(rc.shape, rc.axis, counts[r])
				want[r] = make([]byte, numel(box)*es)
				boxCopy(want[r], box, zeros(len(box)), sum, rc.shape, at(len(box), rc.axis, pre[r]), box, es)
			}
			cases = append(cases, hierCase{fmt.Sprintf("ReduceScatter %v %s %v axis %d counts %v into %v", rc.op, rc.dt.Name(), rc.shape, rc.axis, counts, rc.into), xs,
				func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					cs := counts
					if rc.counts == nil {
						cs = nil
					}
					if !rc.into {
						return c.ReduceScatter(ctx, x, rc.op, rc.axis, cs)
					}
					y, _ := tensordict.Zeros(rc.dt, along(rc.shape, rc.axis, counts[c.Rank()])...)
					return y, c.ReduceScatterInto(ctx, y, x, rc.op, rc.axis, cs)
				}, want, rc.op == Max})
		}
		return cases
	})
}
