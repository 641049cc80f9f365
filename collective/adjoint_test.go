package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// An adjoint case: the forward on the tape, from rank r's input of shape
// shape(r, n).
type adjCase struct {
	name  string
	shape func(r, n int) []int
	fwd   func(ctx context.Context, tp *Tape, x *Var) (*Var, error)
}

func adjCases(n int) []adjCase {
	cs := []adjCase{
		{"Allreduce", fixed(3, 4), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) { return tp.Allreduce(ctx, x, Sum) }},
		{"Allgather/axis0", uneven(0, 0, 3), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) { return tp.Allgather(ctx, x, 0) }},
		{"Allgather/axis1", uneven(1, 2, 0, 3), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) { return tp.Allgather(ctx, x, 1) }},
		{"ReduceScatter", func(r, n int) []int { return []int{3, tri(n)} }, func(ctx context.Context, tp *Tape, x *Var) (*Var, error) {
			return tp.ReduceScatter(ctx, x, Sum, 1, unevenCounts(tp.c.Size()))
		}},
		{"Alltoall", func(r, n int) []int { return []int{2 * n, r + 1, 2} }, func(ctx context.Context, tp *Tape, x *Var) (*Var, error) {
			return tp.Alltoall(ctx, x, 1, 0, nil)
		}},
		{"Alltoall/uneven", func(r, n int) []int { return []int{r + 2, tri(n)} }, func(ctx context.Context, tp *Tape, x *Var) (*Var, error) {
			return tp.Alltoall(ctx, x, 0, 1, unevenCounts(tp.c.Size()))
		}},
		{"Isend+Irecv/ring", fixed(4, 2), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) {
			c := tp.c
			buf, _ := tensordict.Zeros(memmap.Float64, 4, 2)
			s := tp.Isend(ctx, x, (c.Rank()+1)%c.Size(), 7)
			r := tp.Irecv(ctx, tp.Leaf(buf), (c.Rank()+c.Size()-1)%c.Size(), 7)
			if _, err := s.Wait(ctx); err != nil {
				return nil, err
			}
			return r.Wait(ctx)
		}},
		{"Send+Recv/pairs", fixed(5), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) {
			c := tp.c
			me := c.Rank()
			if me%2 == 0 {
				if me+1 < c.Size() {
					return nil, tp.Send(ctx, x, me+1, 3)
				}
				return nil, nil
			}
			buf, _ := tensordict.Zeros(memmap.Float64, 5)
			return tp.Recv(ctx, tp.Leaf(buf), me-1, 3)
		}},
	}
	for root := range n {
		cs = append(cs,
			adjCase{fmt.Sprintf("Bcast/root%d", root), fixed(2, 3), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) { return tp.Bcast(ctx, x, root) }},
			adjCase{fmt.Sprintf("Reduce/root%d", root), fixed(4), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) { return tp.Reduce(ctx, x, Sum, root) }},
			adjCase{fmt.Sprintf("Gather/root%d", root), uneven(1, 2, 0), func(ctx context.Context, tp *Tape, x *Var) (*Var, error) { return tp.Gather(ctx, x, 1, root) }},
			adjCase{fmt.Sprintf("Scatter/root%d", root), func(r, n int) []int { return []int{tri(n), 2} }, func(ctx context.Context, tp *Tape, x *Var) (*Var, error) {
				return tp.Scatter(ctx, x, 0, unevenCounts(tp.c.Size()), root)
			}},
		)
	}
	return cs
}

func dotT(t testing.TB, a, b *tensordict.Tensor) float64 {
	if a == nil || b == nil {
		return 0
	}
	if !slices.Equal(a.Shape(), b.Shape()) {
		t.Errorf("shapes %v and %v", a.Shape(), b.Shape())
		return math.NaN()
	}
	return dot(toND(t, a), toND(t, b))
}

// TestAdjoint_DotProduct checks every operation's adjoint with the
// dot-product test at 2, 3 and 4 ranks, on both transports: with x and y
// random and different on every rank,
//
//	sum over r of <A(x)_r, y_r> == sum over r of <x_r, A*(y)_r>
//
// where A*(y) is what Backward gives x from the seed y. (mpi4torch's
// Allgather backward fails this from 3 ranks on, for a root other than the
// first: its tests pass because their y is the same on every rank.)
func TestAdjoint_DotProduct(t *testing.T) {
	for _, tr := range transports() {
		for _, n := range []int{2, 3, 4} {
			t.Run(name(tr, n), func(t *testing.T) {
				dotProductTest(t, group(t, n, tr))
			})
		}
	}
}

// dotProductTest runs the dot-product test of every adjoint (adjCases) on
// comms: sum over r of <A(x)_r, y_r> equals sum over r of <x_r, A*(y)_r>,
// x and y random (y_r from a generator of rank r's own), and is not 0.
func dotProductTest(t *testing.T, comms []*Comm) {
	dotProductCases(t, comms, adjCases(len(comms)))
}

// dotProductCases is dotProductTest of cases.
func dotProductCases(t *testing.T, comms []*Comm, cases []adjCase) {
	n := len(comms)
	for i, ac := range cases {
		t.Run(ac.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n)*7919, uint64(i)))
			xs := make([]*tensordict.Tensor, n)
			for r := range n {
				xs[r] = randTensor(t, rng, memmap.Float64, ac.shape(r, n)...)
			}
			type side struct{ lhs, rhs float64 }
			res := all(t, comms, func(ctx context.Context, c *Comm) (side, error) {
				tp := NewTape(c)
				x := tp.Leaf(xs[c.Rank()])
				y, err := ac.fwd(ctx, tp, x)
				if err != nil {
					return side{}, err
				}
				var seed *tensordict.Tensor
				var s side
				if y != nil && y.Value() != nil {
					rr := rand.New(rand.NewPCG(uint64(c.Rank())+1, uint64(i)+99))
					seed = randTensor(t, rr, memmap.Float64, y.Value().Shape()...)
					s.lhs = dotT(t, y.Value(), seed)
				}
				if err := tp.Backward(ctx, y, seed); err != nil {
					return side{}, err
				}
				s.rhs = dotT(t, x.Value(), x.Grad())
				return s, nil
			})
			var lhs, rhs float64
			for _, s := range res {
				lhs += s.lhs
				rhs += s.rhs
			}
			if math.Abs(lhs-rhs) > 1e-10*max(1, math.Abs(lhs)) {
				t.Fatalf("sum <A(x), y> = %.15g, sum <x, A*(y)> = %.15g", lhs, rhs)
			}
			if lhs == 0 {
				t.Fatal("the test is vacuous: <A(x), y> is 0")
			}
		})
	}
}

// TestAdjoint_NonSumRefused: the adjoint of a reduction other than Sum
// fails with ErrNoAdjoint on every rank, and the communicator goes on.
func TestAdjoint_NonSumRefused(t *testing.T) {
	comms := group(t, 3, TCP)
	for _, op := range []Op{Max, Min, Prod} {
		_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (*Var, error) {
			tp := NewTape(c)
			x, _ := tensordict.FromSlice([]float64{1, 2, float64(c.Rank())})
			y, err := tp.Allreduce(ctx, tp.Leaf(x), op)
			if err != nil {
				return nil, err
			}
			return nil, tp.Backward(ctx, y, nil)
		})
		for r, err := range errs {
			if !errors.Is(err, ErrNoAdjoint) {
				t.Fatalf("%v: rank %d: %v, want ErrNoAdjoint", op, r, err)
			}
		}
		for _, f := range []func(ctx context.Context, c *Comm, g *tensordict.Tensor) error{
			func(ctx context.Context, c *Comm, g *tensordict.Tensor) error {
				_, err := c.ReduceAdjoint(ctx, g, op, 0)
				return err
			},
			func(ctx context.Context, c *Comm, g *tensordict.Tensor) error {
				_, err := c.ReduceScatterAdjoint(ctx, g, op, 0)
				return err
			},
		} {
			_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
				g, _ := tensordict.FromSlice([]float64{1, 2, 3})
				return 0, f(ctx, c, g)
			})
			for r, err := range errs {
				if !errors.Is(err, ErrNoAdjoint) {
					t.Fatalf("%v: rank %d: %v, want ErrNoAdjoint", op, r, err)
				}
			}
		}
	}
	all(t, comms, func(ctx context.Context, c *Comm) (int, error) { return 0, c.Barrier(ctx) })
}

// TestTape_BackwardTwice: a tape replays once.
func TestTape_BackwardTwice(t *testing.T) {
	comms := group(t, 2, SHM)
	_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
		tp := NewTape(c)
		x, _ := tensordict.FromSlice([]float64{1, 2})
		y, err := tp.Allreduce(ctx, tp.Leaf(x), Sum)
		if err != nil {
			return 0, err
		}
		if err := tp.Backward(ctx, y, nil); err != nil {
			return 0, err
		}
		return 0, tp.Backward(ctx, y, nil)
	})
	for r, err := range errs {
		if !errors.Is(err, ErrNoAdjoint) {
			t.Fatalf("rank %d: %v, want ErrNoAdjoint", r, err)
		}
	}
}
