package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Bcast and Allgather of a hierarchical communicator (hier_move.go),
// against the same calls on a communicator that is TCP throughout (the
// flat algorithms) and the plain computation.

// hierLayouts are the layouts the hierarchy's tests run: two hosts of two,
// interleaved hosts, three ranks and one, and a rank alone beside two
// hosts of two.
var hierLayouts = [][]int{{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 0, 1}, {0, 1, 1, 2, 2}}

// testLayouts returns hierLayouts, or under the race detector the one that
// covers most (three hosts of unequal sizes, one of them a rank alone):
// the large bit-for-bit tables take up to a minute each there, and CI's
// race step has a budget; go test ./... runs every layout.
func testLayouts() [][]int {
	if raceEnabled {
		return [][]int{{0, 1, 1, 2, 2}}
	}
	return hierLayouts
}

// testRoots returns the roots the hierarchy's tables run a rooted
// collective at: every rank, or under the race detector one of each kind
// the hierarchy treats apart (rank 0; a rank alone on its host; a host's
// leader with host-mates; a host-mate), which is where its paths differ.
func testRoots(hosts []int) []int {
	if !raceEnabled {
		roots := make([]int, len(hosts))
		for r := range roots {
			roots[r] = r
		}
		return roots
	}
	per := map[int]int{}
	for _, h := range hosts {
		per[h]++
	}
	kinds := map[string]bool{}
	var roots []int
	for r, h := range hosts {
		kind := "mate"
		switch {
		case r == 0:
			kind = "zero"
		case per[h] == 1:
			kind = "alone"
		case slices.Index(hosts, h) == r:
			kind = "leader"
		}
		if !kinds[kind] {
			kinds[kind] = true
			roots = append(roots, r)
		}
	}
	return roots
}

// tbytes returns x's bytes (nil for nil).
func tbytes(t testing.TB, x *tensordict.Tensor) []byte {
	t.Helper()
	if x == nil {
		return nil
	}
	b, err := x.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHier_BcastAllgatherSameBitsAsFlat runs Bcast from every root and
// Allgather (uneven sizes, several axes and dtypes, small and in 1 MiB
// pieces, into a given output), three rounds with an Allreduce between
// (the host's file sets and phases in both parities), on every layout:
// every rank's result has the bits the flat algorithms give (a TCP
// communicator of as many ranks, same inputs) and the plain computation's.
func TestHier_BcastAllgatherSameBitsAsFlat(t *testing.T) {
	runHierTable(t, 29, func(t *testing.T, hosts []int, rng *rand.Rand) []hierCase {
		n := len(hosts)
		var cases []hierCase
		for _, sz := range []struct {
			dt    memmap.DType
			shape []int
		}{{memmap.Float64, []int{3, 5}}, {memmap.BFloat16, []int{0, 4}}, {memmap.Float64, []int{300_001}}} {
			for _, root := range testRoots(hosts) {
				xs := make([]*tensordict.Tensor, n)
				for r := range n {
					xs[r] = randTensor(t, rng, sz.dt, sz.shape...)
				}
				want := tbytes(t, xs[root])
				cases = append(cases, hierCase{fmt.Sprintf("Bcast %s %v root %d", sz.dt.Name(), sz.shape, root), xs,
					func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
						if c.Rank() != root && c.Rank()%2 == 1 {
							x = nil // the root's shape comes to those without a tensor
						}
						return c.Bcast(ctx, x, root)
					}, sameFor(n, want), true})
				cases = append(cases, hierCase{fmt.Sprintf("BcastInto %s %v root %d", sz.dt.Name(), sz.shape, root), xs,
					func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
						y, _ := tensordict.Zeros(x.DType(), x.Shape()...)
						copy(tbytes(t, y), tbytes(t, x))
						return y, c.BcastInto(ctx, y, root)
					}, sameFor(n, want), true})
			}
		}
		for _, ag := range []struct {
			dt    memmap.DType
			axis  int
			shape func(r int) []int
			into  bool
		}{
			{memmap.Float16, 0, func(r int) []int { return []int{r % 3, 4} }, false},
			{memmap.Int32, 2, func(r int) []int { return []int{2, 3, (r*5 + 1) % 4} }, false},
			{memmap.Uint8, 1, func(r int) []int { return []int{3, r + 1} }, true},
			{memmap.Float32, 0, func(r int) []int { return []int{100 + 1000*r, 300} }, false}, // pieces of 1 MiB
			{memmap.Float64, 1, func(r int) []int { return []int{64, 1000 * (n - r)} }, true}, // boxes of every rank in every row
		} {
			xs := make([]*tensordict.Tensor, n)
			in := make([]nd, n)
			for r := range n {
				xs[r] = randTensor(t, rng, ag.dt, ag.shape(r)...)
				in[r] = toND(t, xs[r])
			}
			ref := concat(in, ag.axis)
			wantT, _ := tensordict.Zeros(ag.dt, ref.shape...)
			wb := tbytes(t, wantT)
			for i, v := range ref.v {
				ag.dt.PutFloat64(wb[i*ag.dt.Size():], v)
			}
			cases = append(cases, hierCase{fmt.Sprintf("Allgather %s axis %d into %v", ag.dt.Name(), ag.axis, ag.into), xs,
				func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
					if !ag.into {
						return c.Allgather(ctx, x, ag.axis)
					}
					y, _ := tensordict.Zeros(ag.dt, ref.shape...)
					return y, c.AllgatherInto(ctx, y, x, ag.axis)
				}, sameFor(n, wb), true})
		}
		return cases
	})
}

// hierCase is a row of the hierarchy's bit-for-bit tables: a call, each
// rank's input and each rank's expected result (nil: no result), and
// whether a TCP communicator of as many ranks must give those bits too
// (flat).
type hierCase struct {
	name string
	xs   []*tensordict.Tensor
	run  func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error)
	want [][]byte
	flat bool
}

// sameFor is want for each of n ranks.
func sameFor(n int, want []byte) [][]byte {
	ws := make([][]byte, n)
	for r := range ws {
		ws[r] = want
	}
	return ws
}

// runHierTable runs a bit-for-bit table on every test layout: cases
// builds the rows for the layout's hosts (a host index per rank) from rng
// (seeded with seed and the rank count), which run on a hierarchy of that
// layout and a TCP communicator of as many ranks (runHierCases).
func runHierTable(t *testing.T, seed uint64, cases func(t *testing.T, hosts []int, rng *rand.Rand) []hierCase) {
	for _, hosts := range testLayouts() {
		n := len(hosts)
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			hier := hierGroup(t, hosts, Hier)
			flat := group(t, n, TCP)
			runHierCases(t, hier, flat, cases(t, hosts, rand.New(rand.NewPCG(uint64(n), seed))))
		})
	}
}

// runHierCases runs every case three rounds on hier (and on flat where
// the case says so), with an Allreduce through the hosts' mappings after
// the second, so that the calls use both file sets and phases of both
// parities, and fails the test at the first rank whose result differs.
// Under the race detector it runs two rounds with the Allreduce between
// them: both parities, without the second round's repeat of the first;
// and on hier only: the flat algorithms' own tests run them under it, and
// every result is still checked against the plain computation.
func runHierCases(t *testing.T, hier, flat []*Comm, cases []hierCase) {
	t.Helper()
	one, _ := tensordict.FromSlice([]float64{1})
	rounds, flipAfter := 3, 1
	if raceEnabled {
		rounds, flipAfter = 2, 0
	}
	for round := range rounds {
		for _, oc := range cases {
			comms := [][]*Comm{hier}
			if oc.flat && !raceEnabled {
				comms = append(comms, flat)
			}
			for _, cs := range comms {
				got := all(t, cs, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
					return oc.run(ctx, c, oc.xs[c.Rank()])
				})
				for r, g := range got {
					if (g == nil) != (oc.want[r] == nil) || !bytes.Equal(tbytes(t, g), oc.want[r]) {
						t.Fatalf("round %d, %s, %v: rank %d's result differs from the plain computation's", round, oc.name, cs[0].Transport(), r)
					}
				}
			}
		}
		if round == flipAfter {
			// One more collective through the hosts' mappings: the next
			// round's calls use the other file sets.
			all(t, hier, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) { return c.Allreduce(ctx, one, Sum) })
		}
	}
}

// TestHier_MovesErrorsSameOnEveryRank: a Bcast, Allgather, Reduce,
// ReduceScatter, Gather, Scatter or Alltoall that the ranks disagree on
// fails on every rank with the same error, whichever
// host a rank is on, and the communicator goes on (the hosts' mappings
// too: no rank moved a phase).
func TestHier_MovesErrorsSameOnEveryRank(t *testing.T) {
	comms := hierGroup(t, []int{0, 1, 0, 1}, Hier)
	f64 := func(shape ...int) *tensordict.Tensor {
		x, _ := tensordict.Zeros(memmap.Float64, shape...)
		return x
	}
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, c *Comm) error
		is   error
	}{
		{"Bcast roots", func(ctx context.Context, c *Comm) error {
			_, err := c.Bcast(ctx, f64(4), c.Rank()/3)
			return err
		}, ErrMismatch},
		{"Bcast root out of range", func(ctx context.Context, c *Comm) error {
			_, err := c.Bcast(ctx, f64(4), 4)
			return err
		}, ErrArgument},
		{"BcastInto shapes", func(ctx context.Context, c *Comm) error {
			return c.BcastInto(ctx, f64(4+c.Rank()/3), 1)
		}, ErrMismatch},
		{"Allgather dtypes", func(ctx context.Context, c *Comm) error {
			x := f64(2, 3)
			if c.Rank() == 2 {
				x, _ = tensordict.Zeros(memmap.Float32, 2, 3)
			}
			_, err := c.Allgather(ctx, x, 0)
			return err
		}, ErrMismatch},
		{"Allgather shapes off the axis", func(ctx context.Context, c *Comm) error {
			_, err := c.Allgather(ctx, f64(2, 3+c.Rank()%2), 0)
			return err
		}, ErrMismatch},
		{"Allgather axis", func(ctx context.Context, c *Comm) error {
			_, err := c.Allgather(ctx, f64(2, 3), 2)
			return err
		}, ErrArgument},
		{"Reduce roots", func(ctx context.Context, c *Comm) error {
			_, err := c.Reduce(ctx, f64(4), Sum, c.Rank()%2)
			return err
		}, ErrMismatch},
		{"Reduce ops", func(ctx context.Context, c *Comm) error {
			op := Sum
			if c.Rank() == 3 {
				op = Max
			}
			_, err := c.Reduce(ctx, f64(4), op, 0)
			return err
		}, ErrMismatch},
		{"ReduceInto shapes", func(ctx context.Context, c *Comm) error {
			x := f64(4 + c.Rank()/3)
			return c.ReduceInto(ctx, x, x, Sum, 1)
		}, ErrMismatch},
		{"ReduceScatter counts", func(ctx context.Context, c *Comm) error {
			counts := []int{1, 1, 1, 1}
			if c.Rank() == 1 {
				counts = []int{2, 0, 1, 1}
			}
			_, err := c.ReduceScatter(ctx, f64(4, 3), Sum, 0, counts)
			return err
		}, ErrMismatch},
		{"ReduceScatter uneven without counts", func(ctx context.Context, c *Comm) error {
			_, err := c.ReduceScatter(ctx, f64(2, 5), Sum, 1, nil)
			return err
		}, ErrArgument},
		{"ReduceScatter beside Reduce", func(ctx context.Context, c *Comm) error {
			if c.Rank() == 2 {
				_, err := c.Reduce(ctx, f64(4), Sum, 0)
				return err
			}
			_, err := c.ReduceScatter(ctx, f64(4), Sum, 0, nil)
			return err
		}, ErrMismatch},
		{"Gather roots", func(ctx context.Context, c *Comm) error {
			_, err := c.Gather(ctx, f64(2, 3), 0, c.Rank()/2)
			return err
		}, ErrMismatch},
		{"Gather shapes off the axis", func(ctx context.Context, c *Comm) error {
			_, err := c.Gather(ctx, f64(2, 3+c.Rank()%2), 0, 1)
			return err
		}, ErrMismatch},
		{"Scatter counts", func(ctx context.Context, c *Comm) error {
			counts := []int{1, 1, 1, 1}
			if c.Rank() == 3 {
				counts = []int{1, 2, 0, 1}
			}
			_, err := c.Scatter(ctx, f64(4, 3), 0, counts, 2)
			return err
		}, ErrMismatch},
		{"Scatter uneven without counts", func(ctx context.Context, c *Comm) error {
			_, err := c.Scatter(ctx, f64(5, 3), 0, nil, 1)
			return err
		}, ErrArgument},
		{"Alltoall axes", func(ctx context.Context, c *Comm) error {
			_, err := c.Alltoall(ctx, f64(4, 3), c.Rank()%2, 1-c.Rank()%2, nil)
			return err
		}, ErrMismatch},
		{"Alltoall beside Scatter", func(ctx context.Context, c *Comm) error {
			if c.Rank() == 2 {
				_, err := c.Scatter(ctx, f64(4, 3), 0, nil, 2)
				return err
			}
			_, err := c.Alltoall(ctx, f64(4, 3), 1, 0, nil)
			return err
		}, ErrMismatch},
		{"Bcast beside Allgather", func(ctx context.Context, c *Comm) error {
			if c.Rank() == 1 {
				_, err := c.Bcast(ctx, f64(2, 3), 0)
				return err
			}
			_, err := c.Allgather(ctx, f64(2, 3), 0)
			return err
		}, ErrMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) { return 0, tc.fn(ctx, c) })
			for r, err := range errs {
				if !errors.Is(err, tc.is) || err.Error() != errs[0].Error() {
					t.Fatalf("rank %d: %v; rank 0: %v; want the same %v", r, err, errs[0], tc.is)
				}
			}
			t.Logf("%v", errs[0])
		})
	}
	got := all(t, comms, func(ctx context.Context, c *Comm) ([]float64, error) {
		x, _ := tensordict.FromSlice([]float64{float64(c.Rank())})
		y, err := c.Allgather(ctx, x, 0)
		if err != nil {
			return nil, err
		}
		// [0 1 2 3] * 4 reduce-scattered: rank r has 4r; its sum at
		// rank 2, broadcast from there.
		z, err := c.ReduceScatter(ctx, y, Sum, 0, nil)
		if err != nil {
			return nil, err
		}
		w, err := c.Reduce(ctx, z, Sum, 2)
		if err != nil {
			return nil, err
		}
		if err := c.BcastInto(ctx, w, 2); err != nil {
			return nil, err
		}
		yv, _ := tensordict.Values[float64](y)
		wv, _ := tensordict.Values[float64](w)
		return append(yv, wv...), nil
	})
	for r, v := range got {
		if fmt.Sprint(v) != "[0 1 2 3 24]" {
			t.Fatalf("rank %d after the errors: %v, want [0 1 2 3 24]", r, v)
		}
	}
}

// TestHier_MovesRankGoneFailsEveryRank: in the middle of a hierarchy's
// Bcast, Allgather, Reduce, ReduceScatter, Gather, Scatter or Alltoall, a
// rank that closes instead
// of calling it fails every other with ErrPeerLost, and one whose context
// has ended breaks it off for all (its own call fails with its context's
// error, the others' with ErrAborted): the root, a leader, a host-mate;
// none waits for its deadline.
func TestHier_MovesRankGoneFailsEveryRank(t *testing.T) {
	bcast := func(ctx context.Context, c *Comm, x *tensordict.Tensor) error { return c.BcastInto(ctx, x, 1) }
	allgather := func(ctx context.Context, c *Comm, x *tensordict.Tensor) error {
		_, err := c.Allgather(ctx, x, 0)
		return err
	}
	reduce := func(ctx context.Context, c *Comm, x *tensordict.Tensor) error { return c.ReduceInto(ctx, x, x, Sum, 1) }
	reduceScatter := func(ctx context.Context, c *Comm, x *tensordict.Tensor) error {
		_, err := c.ReduceScatter(ctx, x, Sum, 0, nil)
		return err
	}
	gather := func(ctx context.Context, c *Comm, x *tensordict.Tensor) error {
		_, err := c.Gather(ctx, x, 0, 1)
		return err
	}
	scatter := func(ctx context.Context, c *Comm, x *tensordict.Tensor) error {
		_, err := c.Scatter(ctx, x, 0, nil, 1)
		return err
	}
	alltoall := func(ctx context.Context, c *Comm, x *tensordict.Tensor) error {
		b, _ := x.Bytes()
		x, _ = tensordict.FromBytes(memmap.Float32, []int{4, len(b) / 16}, b)
		_, err := c.Alltoall(ctx, x, 1, 0, nil)
		return err
	}
	for _, tc := range []struct {
		op     string
		fn     func(ctx context.Context, c *Comm, x *tensordict.Tensor) error
		victim int
	}{{"Bcast", bcast, 1}, {"Bcast", bcast, 2}, {"Bcast", bcast, 3}, {"Allgather", allgather, 0}, {"Allgather", allgather, 3},
		{"Reduce", reduce, 1}, {"Reduce", reduce, 2}, {"Reduce", reduce, 3}, {"ReduceScatter", reduceScatter, 0}, {"ReduceScatter", reduceScatter, 3},
		{"Gather", gather, 1}, {"Gather", gather, 2}, {"Gather", gather, 3}, {"Scatter", scatter, 1}, {"Scatter", scatter, 2}, {"Scatter", scatter, 3},
		{"Alltoall", alltoall, 0}, {"Alltoall", alltoall, 3}} {
		for _, closed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s rank %d closed %v", tc.op, tc.victim, closed), func(t *testing.T) {
				comms := hierGroup(t, []int{0, 1, 0, 1}, Hier)
				start := time.Now()
				_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					x, _ := tensordict.Zeros(memmap.Float32, 1<<20)
					if c.Rank() == tc.victim {
						if closed {
							return 0, c.Close()
						}
						ctx, cancel := context.WithCancel(ctx)
						cancel()
						return 0, tc.fn(ctx, c, x)
					}
					return 0, tc.fn(ctx, c, x)
				})
				for r, err := range errs {
					var want error
					switch {
					case r == tc.victim && !closed:
						want = context.Canceled
					case r != tc.victim && closed:
						want = ErrPeerLost
					case r != tc.victim:
						want = ErrAborted
					}
					if want == nil && err != nil || want != nil && !errors.Is(err, want) {
						t.Fatalf("rank %d: %v, want %v", r, err, want)
					}
				}
				if d := time.Since(start); d > 30*time.Second {
					t.Fatalf("the ranks took %v to fail", d)
				}
				t.Logf("rank %d: %v", (tc.victim+1)%4, errs[(tc.victim+1)%4])
			})
		}
	}
}

// TestHier_MovesAdjointDotProduct: the dot-product test of every adjoint
// (adjoint_test.go's cases) on hierarchical communicators, where every
// collective but Barrier goes by levels: sum over r of <A(x)_r, y_r> equals
// sum over r of <x_r, A*(y)_r>.
func TestHier_MovesAdjointDotProduct(t *testing.T) {
	for _, hosts := range [][]int{{0, 1, 0, 1}, {0, 1, 1, 2, 2}} {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			dotProductTest(t, hierGroup(t, hosts, Hier))
		})
	}
}
