//go:build linux

package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestShm_PipelinedReduce: Allreduce and Reduce of tensors of several
// chunks (the last one short, shares of unequal length) through shared
// mappings, in place and not, over 2 to 4 ranks: every rank gets exactly
// the rank-order reduction (the bits of reducing the ranks' tensors left
// to right), and Reduce's other ranks zeros.
func TestShm_PipelinedReduce(t *testing.T) {
	type pipeCase struct {
		dt     memmap.DType
		op     Op
		chunks int // whole chunks before a short one
	}
	ranks, cases := []int{2, 3, 4}, []pipeCase{
		{memmap.Float32, Sum, 2},
		{memmap.Float64, Sum, 1},
		{memmap.Int64, Sum, 3},
		{memmap.Uint8, Max, 2},
	}
	if raceEnabled {
		// The ranks' synchronisation is the same for every dtype and
		// chunk count: under the race detector (ten times slower) two
		// cases and two sizes of group show it.
		ranks, cases = []int{2, 4}, []pipeCase{cases[0], cases[3]}
	}
	for _, n := range ranks {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := group(t, n, SHM)
			for _, tc := range cases {
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

// TestShm_PipelineBreakOff: a rank whose context ends in the middle of a
// pipelined Allreduce (waiting for the others' chunks) breaks off with its
// context's error, and the others return at once, with ErrAborted or (when
// they already had every chunk) the result; none waits for its deadline.
func TestShm_PipelineBreakOff(t *testing.T) {
	comms := group(t, 3, SHM)
	const elems = 4 << 20 // 16 MiB of float32: 16 chunks of 3 shares
	xs := make([]*tensordict.Tensor, 3)
	for r := range xs {
		xs[r], _ = tensordict.Zeros(memmap.Float32, elems)
	}
	for i := range 50 {
		errs := make([]error, 3)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, errs = onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
				if c.Rank() == 2 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Duration(1+i%8)*time.Millisecond)
					defer cancel()
				}
				return 0, c.AllreduceInto(ctx, xs[c.Rank()], xs[c.Rank()], Sum)
			})
		}()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatalf("iteration %d: a rank is still in the Allreduce after a minute", i)
		}
		if errs[2] == nil {
			for r, err := range errs {
				if err != nil {
					t.Fatalf("iteration %d: rank %d failed (%v) where rank 2 did not", i, r, err)
				}
			}
			continue
		}
		if !errors.Is(errs[2], context.DeadlineExceeded) || !strings.Contains(errs[2].Error(), "rank 2 (this rank) broke off") {
			t.Fatalf("rank 2, whose context ended: %v; want its context's error saying it broke off", errs[2])
		}
		for r, err := range errs[:2] {
			if err != nil && !errors.Is(err, ErrAborted) {
				t.Fatalf("rank %d: %v, want ErrAborted or no error", r, err)
			}
		}
		t.Logf("rank 2 broke off in iteration %d; the others: %v", i, errs[:2])
		return
	}
	t.Skip("rank 2 never had to wait long enough for its context to end (a fast machine)")
}

// TestShm_PipelinedReduceScatter: ReduceScatter of tensors whose blocks
// span several chunks, along the first axis (contiguous blocks) and the
// last (a run per row), with uneven counts, over 2 to 4 ranks: rank r
// gets exactly block r of the rank-order reduction.
func TestShm_PipelinedReduceScatter(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := group(t, n, SHM)
			for _, tc := range []struct {
				dt    memmap.DType
				shape []int
				axis  int
			}{
				{memmap.Float32, []int{300, 3001}, 0},
				{memmap.Float32, []int{300, 3001}, 1},
				{memmap.Int64, []int{7, 50, 1003}, 2},
			} {
				length := tc.shape[tc.axis]
				counts := evenCounts(length, n)
				counts[0] += 5
				counts[n-1] -= 5
				t.Run(fmt.Sprintf("%v/%v/axis %d", tc.dt, tc.shape, tc.axis), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(n), uint64(tc.axis)))
					xs := make([]*tensordict.Tensor, n)
					srcs := make([][]byte, n)
					for r := range n {
						xs[r] = randTensor(t, rng, tc.dt, tc.shape...)
						srcs[r] = bytes.Clone(must1(xs[r].Bytes()))
					}
					sum := make([]byte, len(srcs[0]))
					foldRef(Sum, tc.dt, sum, srcs)
					want := split(toND(t, must1(tensordict.FromBytes(tc.dt, tc.shape, sum))), tc.axis, counts)
					got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						return c.ReduceScatter(ctx, xs[c.Rank()], Sum, tc.axis, counts)
					})
					for r := range n {
						if !closeND(toND(t, got[r]), want[r], 0) {
							t.Fatalf("rank %d: block differs from the rank-order reduction's", r)
						}
					}
				})
			}
		})
	}
}
