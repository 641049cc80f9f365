package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A collective case: each rank's input, the call, and the plain
// single-process answer.
type collCase struct {
	name  string
	shape func(r, n int) []int // rank r's input shape; nil: no input
	dt    memmap.DType
	run   func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error)
	ref   func(xs []nd, n int) []nd // each rank's expected output (zero shape: nil)
	exact bool
}

func fixed(s ...int) func(r, n int) []int { return func(r, n int) []int { return s } }

// uneven has size r+1 along axis.
func uneven(axis int, s ...int) func(r, n int) []int {
	return func(r, n int) []int {
		out := append([]int(nil), s...)
		out[axis] = r + 1
		return out
	}
}

func unevenCounts(n int) []int {
	c := make([]int, n)
	for r := range c {
		c[r] = r + 1
	}
	return c
}

func tri(n int) int { return n * (n + 1) / 2 }

func collCases(n int) []collCase {
	var cs []collCase
	for _, root := range []int{0, n - 1, 1} {
		cs = append(cs,
			collCase{name: fmt.Sprintf("Bcast/root%d", root), shape: fixed(3, 5), dt: memmap.Float64,
				run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					return c.Bcast(ctx, x, root)
				},
				ref: func(xs []nd, n int) []nd {
					out := make([]nd, n)
					for r := range out {
						out[r] = xs[root]
					}
					return out
				}, exact: true},
			collCase{name: fmt.Sprintf("Reduce/root%d", root), shape: fixed(4, 3), dt: memmap.Float64,
				run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					return c.Reduce(ctx, x, Sum, root)
				},
				ref: func(xs []nd, n int) []nd {
					out := make([]nd, n)
					for r := range out {
						out[r] = zerosND(xs[r].shape)
					}
					out[root] = reduce(xs, Sum, memmap.Float64)
					return out
				}},
			collCase{name: fmt.Sprintf("Gather/axis1/root%d", root), shape: uneven(1, 2, 0, 3), dt: memmap.Float64,
				run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					return c.Gather(ctx, x, 1, root)
				},
				ref: func(xs []nd, n int) []nd {
					out := make([]nd, n)
					out[root] = concat(xs, 1)
					return out
				}, exact: true},
			collCase{name: fmt.Sprintf("Scatter/axis2/root%d", root), shape: func(r, n int) []int { return []int{2, 3, tri(n)} }, dt: memmap.Float64,
				run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					if c.Rank() != root {
						x = nil
					}
					return c.Scatter(ctx, x, 2, unevenCounts(c.Size()), root)
				},
				ref: func(xs []nd, n int) []nd { return split(xs[root], 2, unevenCounts(n)) }, exact: true},
		)
	}
	cs = append(cs,
		collCase{name: "Allreduce/Sum/float64", shape: fixed(5, 7), dt: memmap.Float64,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.Allreduce(ctx, x, Sum)
			},
			ref: func(xs []nd, n int) []nd { return repeat(reduce(xs, Sum, memmap.Float64), n) }},
		collCase{name: "Allreduce/Sum/large", shape: fixed(300, 1001), dt: memmap.Float32,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.Allreduce(ctx, x, Sum)
			},
			ref: func(xs []nd, n int) []nd { return repeat(reduce(xs, Sum, memmap.Float64), n) }},
		collCase{name: "Allgather/axis0", shape: uneven(0, 0, 4), dt: memmap.Float16,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.Allgather(ctx, x, 0)
			},
			ref: func(xs []nd, n int) []nd { return repeat(concat(xs, 0), n) }, exact: true},
		collCase{name: "Allgather/axis2", shape: uneven(2, 3, 2, 0), dt: memmap.Int32,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.Allgather(ctx, x, 2)
			},
			ref: func(xs []nd, n int) []nd { return repeat(concat(xs, 2), n) }, exact: true},
		collCase{name: "Allgather/large", shape: func(r, n int) []int { return []int{100 + 1000*r, 300} }, dt: memmap.Float32,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.Allgather(ctx, x, 0)
			},
			ref: func(xs []nd, n int) []nd { return repeat(concat(xs, 0), n) }, exact: true},
		collCase{name: "ReduceScatter/axis1", shape: func(r, n int) []int { return []int{2, tri(n), 3} }, dt: memmap.Float64,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.ReduceScatter(ctx, x, Sum, 1, unevenCounts(c.Size()))
			},
			ref: func(xs []nd, n int) []nd { return split(reduce(xs, Sum, memmap.Float64), 1, unevenCounts(n)) }},
		collCase{name: "ReduceScatter/Max/even", shape: func(r, n int) []int { return []int{4 * n, 3} }, dt: memmap.Int16,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.ReduceScatter(ctx, x, Max, 0, nil)
			},
			ref: func(xs []nd, n int) []nd {
				return split(reduce(xs, Max, memmap.Int16), 0, evenCounts(4*n, n))
			}, exact: true},
		collCase{name: "Alltoall/g0s1", shape: func(r, n int) []int { return []int{r + 1, tri(n), 2} }, dt: memmap.Float64,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.Alltoall(ctx, x, 0, 1, unevenCounts(c.Size()))
			},
			ref: func(xs []nd, n int) []nd { return alltoallRef(xs, n, 0, 1, unevenCounts(n)) }, exact: true},
		collCase{name: "Alltoall/g2s0", shape: func(r, n int) []int { return []int{2 * n, 3, r + 2} }, dt: memmap.Uint8,
			run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
				return c.Alltoall(ctx, x, 2, 0, nil)
			},
			ref: func(xs []nd, n int) []nd { return alltoallRef(xs, n, 2, 0, evenCounts(2*n, n)) }, exact: true},
	)
	// Every reduction on every dtype it takes.
	for _, dt := range []memmap.DType{memmap.Float32, memmap.Float64, memmap.Int8, memmap.Int16, memmap.Int32, memmap.Int64, memmap.Uint8, memmap.Uint16, memmap.Uint32, memmap.Uint64, memmap.Bool} {
		for op := Sum; op < numOps; op++ {
			if !op.Supports(dt) {
				continue
			}
			cs = append(cs, collCase{name: fmt.Sprintf("Allreduce/%v/%s", op, dt.Name()), shape: fixed(6, 5), dt: dt,
				run: func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					return c.Allreduce(ctx, x, op)
				},
				ref:   func(xs []nd, n int) []nd { return repeat(reduce(xs, op, dt), n) },
				exact: dt != memmap.Float32 && dt != memmap.Float64})
		}
	}
	return cs
}

func repeat(x nd, n int) []nd {
	out := make([]nd, n)
	for r := range out {
		out[r] = x
	}
	return out
}

// alltoallRef: rank r gets piece r (along s) of every rank's input,
// joined along g.
func alltoallRef(xs []nd, n, g, s int, counts []int) []nd {
	out := make([]nd, n)
	for r := range n {
		var pieces []nd
		for _, x := range xs {
			pieces = append(pieces, split(x, s, counts)[r])
		}
		out[r] = concat(pieces, g)
	}
	return out
}

// TestCollectives_MatchPlainComputation runs every collective on 2, 3 and
// 4 ranks (each a Comm with its own sockets and mappings), through shared
// mappings and over TCP, and compares every rank's result with a plain
// single-process computation.
func TestCollectives_MatchPlainComputation(t *testing.T) {
	for _, tr := range transports() {
		for _, n := range []int{2, 3, 4} {
			t.Run(name(tr, n), func(t *testing.T) {
				comms := group(t, n, tr)
				for i, cc := range collCases(n) {
					t.Run(cc.name, func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(n), uint64(i)))
						xs := make([]*tensordict.Tensor, n)
						in := make([]nd, n)
						for r := range n {
							xs[r] = randTensor(t, rng, cc.dt, cc.shape(r, n)...)
							in[r] = toND(t, xs[r])
						}
						got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
							return cc.run(ctx, c, xs[c.Rank()])
						})
						want := cc.ref(in, n)
						tol := 1e-12
						if cc.dt == memmap.Float32 {
							tol = 1e-5
						}
						if cc.exact {
							tol = 0
						}
						for r := range n {
							if want[r].shape == nil {
								if got[r] != nil {
									t.Fatalf("rank %d: got %v, want nothing", r, got[r])
								}
								continue
							}
							if got[r] == nil {
								t.Fatalf("rank %d: got nothing, want %v", r, want[r].shape)
							}
							if got[r].DType() != cc.dt {
								t.Fatalf("rank %d: dtype %v, want %v", r, got[r].DType(), cc.dt)
							}
							if g := toND(t, got[r]); !closeND(g, want[r], tol) {
								t.Fatalf("rank %d: got %v %v\nwant %v %v", r, g.shape, head(g.v), want[r].shape, head(want[r].v))
							}
						}
					})
				}
			})
		}
	}
}

func head(v []float64) []float64 { return v[:min(len(v), 12)] }

// TestAllreduceInto_InPlace: the result written over the input, small
// (every rank reduces all of it) and large (each a share), on both
// transports.
func TestAllreduceInto_InPlace(t *testing.T) {
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			comms := group(t, 3, tr)
			for _, elems := range []int{5, 100_000} {
				xs := make([]*tensordict.Tensor, 3)
				in := make([]nd, 3)
				rng := rand.New(rand.NewPCG(uint64(elems), 3))
				for r := range xs {
					xs[r] = randTensor(t, rng, memmap.Float64, elems)
					in[r] = toND(t, xs[r])
				}
				want := reduce(in, Max, memmap.Float64)
				all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					return 0, c.AllreduceInto(ctx, xs[c.Rank()], xs[c.Rank()], Max)
				})
				for r, x := range xs {
					if !closeND(toND(t, x), want, 0) {
						t.Fatalf("%d elements: rank %d differs", elems, r)
					}
				}
			}
		})
	}
}
