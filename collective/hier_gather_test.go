package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Gather, Scatter and Alltoall of a hierarchical communicator
// (hier_gather.go, hier_alltoall.go), against the same calls on a
// communicator that is TCP throughout (the flat algorithms) and the plain
// computation.

// ndBytes returns x's values as a tensor of dtype dt's bytes.
func ndBytes(t testing.TB, dt memmap.DType, x nd) []byte {
	t.Helper()
	y, err := tensordict.Zeros(dt, x.shape...)
	if err != nil {
		t.Fatal(err)
	}
	b := tbytes(t, y)
	for i, v := range x.v {
		dt.PutFloat64(b[i*dt.Size():], v)
	}
	return b
}

// into0 returns zeros of dt in shape, for the Into calls.
func into0(dt memmap.DType, shape []int) *tensordict.Tensor {
	y, _ := tensordict.Zeros(dt, shape...)
	return y
}

// TestHier_GatherScatterAlltoallSameBitsAsFlat runs Gather and Scatter to
// and from every root, and Alltoall (uneven sizes and pieces, empty ones,
// several axes and dtypes, small and in 1 MiB pieces, into a given
// output), three rounds with an Allreduce between (the host's file sets
// and phases in both parities), on every layout: every rank's result has
// the bits the flat algorithms give (a TCP communicator of as many ranks,
// same inputs) and the plain computation's; a Gather's other ranks get
// nothing.
func TestHier_GatherScatterAlltoallSameBitsAsFlat(t *testing.T) {
	runHierTable(t, 30, func(t *testing.T, hosts []int, rng *rand.Rand) []hierCase {
		n := len(hosts)
		var cases []hierCase
		inputs := func(dt memmap.DType, shape func(r int) []int) ([]*tensordict.Tensor, []nd) {
			xs, in := make([]*tensordict.Tensor, n), make([]nd, n)
			for r := range n {
				xs[r] = randTensor(t, rng, dt, shape(r)...)
				in[r] = toND(t, xs[r])
			}
			return xs, in
		}
		for _, gc := range []struct {
			dt    memmap.DType
			axis  int
			shape func(r int) []int
			into  bool
		}{
			{memmap.Float16, 0, func(r int) []int { return []int{r % 3, 4} }, false}, // rank 0's empty
			{memmap.Int32, 2, func(r int) []int { return []int{2, 3, (r*5 + 1) % 4} }, true},
			{memmap.Float32, 0, func(r int) []int { return []int{100 + 1000*r, 300} }, false}, // pieces of 1 MiB
			{memmap.Float64, 1, func(r int) []int { return []int{64, 500 * (n - r)} }, true},  // boxes of every rank in every row
		} {
			xs, in := inputs(gc.dt, gc.shape)
			ref := concat(in, gc.axis)
			wb := ndBytes(t, gc.dt, ref)
			for _, root := range testRoots(hosts) {
				want := make([][]byte, n)
				want[root] = wb
				cases = append(cases, hierCase{fmt.Sprintf("Gather %s axis %d root %d into %v", gc.dt.Name(), gc.axis, root, gc.into), xs,
					func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
						if !gc.into {
							return c.Gather(ctx, x, gc.axis, root)
						}
						var y *tensordict.Tensor
						if c.Rank() == root {
							y = into0(gc.dt, ref.shape)
						}
						return y, c.GatherInto(ctx, y, x, gc.axis, root)
					}, want, true})
			}
		}
		for _, sc := range []struct {
			dt     memmap.DType
			shape  []int
			axis   int
			counts []int
			into   bool
		}{
			{memmap.Float64, []int{tri(n), 3}, 0, unevenCounts(n), false},
			{memmap.BFloat16, []int{2, 4 * n}, 1, nil, true},
			{memmap.Uint8, []int{3, 2, n - 1}, 2, lastOnly(n, n-1), false},                    // every piece but the last rank's empty
			{memmap.Float32, []int{400 * tri(n), 300}, 0, scaled(unevenCounts(n), 400), true}, // host blocks in 1 MiB pieces
		} {
			counts := sc.counts
			for _, root := range testRoots(hosts) {
				xs, in := inputs(sc.dt, func(int) []int { return sc.shape })
				pieces := split(in[root], sc.axis, cnt(counts, sc.shape[sc.axis], n))
				want := make([][]byte, n)
				for r := range n {
					want[r] = ndBytes(t, sc.dt, pieces[r])
				}
				cases = append(cases, hierCase{fmt.Sprintf("Scatter %s %v axis %d counts %v root %d into %v", sc.dt.Name(), sc.shape, sc.axis, counts, root, sc.into), xs,
					func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
						cs := counts
						if c.Rank() != root {
							x = nil // the root's shape and counts come to the others
							if c.Rank()%2 == 1 {
								cs = nil
							}
						}
						if !sc.into {
							return c.Scatter(ctx, x, sc.axis, cs, root)
						}
						y := into0(sc.dt, pieces[c.Rank()].shape)
						return y, c.ScatterInto(ctx, y, x, sc.axis, cs, root)
					}, want, true})
			}
		}
		for _, ac := range []struct {
			dt     memmap.DType
			g, s   int
			shape  func(r int) []int
			counts []int
			into   bool
		}{
			{memmap.Float64, 1, 0, func(r int) []int { return []int{2 * n, r + 1, 2} }, nil, false},
			{memmap.Int32, 0, 1, func(r int) []int { return []int{r % 3, tri(n)} }, unevenCounts(n), true}, // rank 0 sends nothing
			{memmap.Float16, 2, 0, func(r int) []int { return []int{n, 3, 1} }, lastOnly(n, n), false},
			{memmap.Float32, 1, 0, func(r int) []int { return []int{200 * tri(n), 300 + r} }, scaled(unevenCounts(n), 200), true}, // blocks in 1 MiB pieces
		} {
			xs, in := inputs(ac.dt, ac.shape)
			counts := cnt(ac.counts, in[0].shape[ac.s], n)
			cut := make([][]nd, n)
			for r := range n {
				cut[r] = split(in[r], ac.s, counts)
			}
			want := make([][]byte, n)
			shapes := make([][]int, n)
			for d := range n {
				var ps []nd
				for r := range n {
					ps = append(ps, cut[r][d])
				}
				ref := concat(ps, ac.g)
				want[d], shapes[d] = ndBytes(t, ac.dt, ref), ref.shape
			}
			cases = append(cases, hierCase{fmt.Sprintf("Alltoall %s gather %d scatter %d counts %v into %v", ac.dt.Name(), ac.g, ac.s, ac.counts, ac.into), xs,
				func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					if !ac.into {
						return c.Alltoall(ctx, x, ac.g, ac.s, ac.counts)
					}
					y := into0(ac.dt, shapes[c.Rank()])
					return y, c.AlltoallInto(ctx, y, x, ac.g, ac.s, ac.counts)
				}, want, true})
		}
		return cases
	})
}

// scaled returns xs times k.
func scaled(xs []int, k int) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = x * k
	}
	return out
}

// cnt returns counts, or for nil the even split of length over n ranks.
func cnt(counts []int, length, n int) []int {
	if counts == nil {
		return evenCounts(length, n)
	}
	return counts
}

// lastOnly returns n counts, all 0 but the last, k.
func lastOnly(n, k int) []int {
	c := make([]int, n)
	c[n-1] = k
	return c
}
