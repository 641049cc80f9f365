package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

func f64(t testing.TB, shape ...int) *tensordict.Tensor {
	t.Helper()
	x, err := tensordict.Zeros(memmap.Float64, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestCollectives_BadInputFailsEveryRank: a bad argument on one rank, or
// arguments that do not fit together, fail the call on every rank with the
// same sentinel (no hang), and the communicator goes on working.
func TestCollectives_BadInputFailsEveryRank(t *testing.T) {
	cases := []struct {
		name string
		want error
		run  func(ctx context.Context, c *Comm) error
	}{
		{"shapes differ", ErrMismatch, func(ctx context.Context, c *Comm) error {
			_, err := c.Allreduce(ctx, f64(t, 2, 2+c.Rank()/2), Sum)
			return err
		}},
		{"dtypes differ", ErrMismatch, func(ctx context.Context, c *Comm) error {
			x := f64(t, 4)
			if c.Rank() == 1 {
				x, _ = tensordict.Zeros(memmap.Float32, 4)
			}
			_, err := c.Allreduce(ctx, x, Sum)
			return err
		}},
		{"different collectives", ErrMismatch, func(ctx context.Context, c *Comm) error {
			if c.Rank() == 2 {
				_, err := c.Bcast(ctx, f64(t, 3), 0)
				return err
			}
			_, err := c.Allreduce(ctx, f64(t, 3), Sum)
			return err
		}},
		{"roots differ", ErrMismatch, func(ctx context.Context, c *Comm) error {
			_, err := c.Gather(ctx, f64(t, 3), 0, c.Rank()%2)
			return err
		}},
		{"root out of range", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.Bcast(ctx, f64(t, 3), 3)
			return err
		}},
		{"negative root", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.Reduce(ctx, f64(t, 3), Sum, -1)
			return err
		}},
		{"counts do not sum", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.Scatter(ctx, f64(t, 6, 2), 0, []int{1, 2, 2}, 0)
			return err
		}},
		{"too few counts", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.ReduceScatter(ctx, f64(t, 6), Sum, 0, []int{3, 3})
			return err
		}},
		{"uneven without counts", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.Alltoall(ctx, f64(t, 4, 2), 1, 0, nil)
			return err
		}},
		{"axis out of range", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.Allgather(ctx, f64(t, 4, 2), 2)
			return err
		}},
		{"same axes", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.Alltoall(ctx, f64(t, 3, 3), 0, 0, nil)
			return err
		}},
		{"no tensor on one rank", ErrArgument, func(ctx context.Context, c *Comm) error {
			x := f64(t, 3)
			if c.Rank() == 1 {
				x = nil
			}
			_, err := c.Allreduce(ctx, x, Sum)
			return err
		}},
		{"bitwise on floats", ErrArgument, func(ctx context.Context, c *Comm) error {
			_, err := c.Allreduce(ctx, f64(t, 3), BXor)
			return err
		}},
		{"sum of float16", ErrArgument, func(ctx context.Context, c *Comm) error {
			x, _ := tensordict.Zeros(memmap.Float16, 3)
			_, err := c.Allreduce(ctx, x, Sum)
			return err
		}},
		{"wrong output shape", ErrArgument, func(ctx context.Context, c *Comm) error {
			out := f64(t, 3)
			if c.Rank() == 2 {
				out = f64(t, 4)
			}
			return c.AllreduceInto(ctx, out, f64(t, 3), Sum)
		}},
	}
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			comms := group(t, 3, tr)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) { return 0, tc.run(ctx, c) })
					for r, err := range errs {
						if !errors.Is(err, tc.want) || !errors.Is(err, rpc.ErrInvalidArgument) {
							t.Fatalf("rank %d: %v, want %v", r, err, tc.want)
						}
						if err.Error() != errs[0].Error() {
							t.Fatalf("rank %d says %q, rank 0 %q", r, err, errs[0])
						}
					}
					// Still usable.
					all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						return c.Allreduce(ctx, f64(t, 2), Sum)
					})
				})
			}
		})
	}
}

// checkGroups returns the communicators a check test runs on: n ranks
// through shared mappings, over TCP, and (on Linux) in a hierarchy of two
// hosts, the first with n-1 ranks.
func checkGroups(t *testing.T, n int) map[string][]*Comm {
	groups := map[string][]*Comm{}
	for _, tr := range transports() {
		groups[string(tr)] = group(t, n, tr)
	}
	if runtime.GOOS == "linux" {
		hosts := make([]int, n)
		hosts[n-1] = 1
		groups["hier"] = hierGroup(t, hosts, Hier)
	}
	return groups
}

// failsAlike runs fn on every rank of comms and fails t unless every rank
// failed with want and the same message, saying says, without panicking,
// and the communicator still works.
func failsAlike(t *testing.T, comms []*Comm, want error, says string, fn func(ctx context.Context, c *Comm) error) {
	t.Helper()
	_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (_ int, err error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panicked: %v", p)
			}
		}()
		return 0, fn(ctx, c)
	})
	t.Logf("rank 0: %v", errs[0])
	for r, err := range errs {
		if !errors.Is(err, want) || !strings.Contains(fmt.Sprint(err), says) {
			t.Fatalf("rank %d: %v, want %v saying %q", r, err, want, says)
		}
		if err.Error() != errs[0].Error() {
			t.Fatalf("rank %d says %q, rank 0 %q", r, err, errs[0])
		}
	}
	all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
		return c.Allreduce(ctx, f64(t, 2), Sum)
	})
}

// TestCollectives_CountsThatWrapFailEveryRank: counts each at least 0
// whose sum wraps around to the axis' length (MaxInt64, MaxInt64, 6 sum
// to 4) are ErrArgument on every rank, for Scatter, ReduceScatter and
// Alltoall, through shared mappings, over TCP and in a hierarchy (whose
// root reserves room for its host-mates' pieces from the counts before
// the check). Before, the check summed them as 4 and passed them, and
// every rank panicked sizing its pieces (makeslice) or waited for its
// deadline. In a hierarchy, a negative count beside a huge one (summing
// to the length too) made the root reserve room for pieces of the huge
// size before the check, and fail on that instead.
func TestCollectives_CountsThatWrapFailEveryRank(t *testing.T) {
	countss := map[string][]int{
		"wrap":     {math.MaxInt64, math.MaxInt64, 6},
		"negative": {0, 1 << 40, 4 - 1<<40}, // also sums to 4
	}
	cases := []struct {
		name string
		run  func(ctx context.Context, c *Comm, counts []int) error
	}{
		{"scatter", func(ctx context.Context, c *Comm, counts []int) error {
			_, err := c.Scatter(ctx, f64(t, 4), 0, counts, 0)
			return err
		}},
		{"reducescatter", func(ctx context.Context, c *Comm, counts []int) error {
			_, err := c.ReduceScatter(ctx, f64(t, 4), Sum, 0, counts)
			return err
		}},
		{"alltoall", func(ctx context.Context, c *Comm, counts []int) error {
			_, err := c.Alltoall(ctx, f64(t, 2, 4), 0, 1, counts)
			return err
		}},
	}
	for name, comms := range checkGroups(t, 3) {
		for cname, counts := range countss {
			for _, tc := range cases {
				t.Run(name+"/"+cname+"/"+tc.name, func(t *testing.T) {
					failsAlike(t, comms, ErrArgument, "count", func(ctx context.Context, c *Comm) error { return tc.run(ctx, c, counts) })
				})
			}
		}
	}
}

// TestCollectives_DescriptionsThatDoNotFitFailEveryRank: a description
// that cannot go between ranks as it is fails the call with ErrArgument on
// every rank, the same message everywhere, and the communicator goes on:
// a root or an axis outside int32 (the wire's), given by one rank; a
// tensor of 70,000 dimensions on one rank (a uint16 on the wire); a
// tensor of 9,000 dimensions on every rank (its description over the 64
// KiB room for one). Before, over TCP and in a hierarchy each rank checked
// its own description as given and the others' as decoded, with a root of
// 1<<32 cut to 0: that rank failed the call (ErrArgument) while the others
// waited for its data until their deadlines; through shared mappings the
// long description overflowed into the room of the next, and the call
// broke the communicator.
func TestCollectives_DescriptionsThatDoNotFitFailEveryRank(t *testing.T) {
	ones := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = 1
		}
		return s
	}
	cases := []struct {
		name, says string
		run        func(ctx context.Context, c *Comm) error
	}{
		{"root 1<<32 on one rank", "root 4294967296 is out of range", func(ctx context.Context, c *Comm) error {
			root := 0
			if c.Rank() == 0 {
				root = 1 << 32
			}
			_, err := c.Bcast(ctx, f64(t, 4), root)
			return err
		}},
		{"axis 1<<32 on one rank", "axis 4294967296 is out of range", func(ctx context.Context, c *Comm) error {
			axis := 0
			if c.Rank() == 1 {
				axis = 1 << 32
			}
			_, err := c.Allgather(ctx, f64(t, 4), axis)
			return err
		}},
		{"70000 dimensions on one rank", "70000 dimensions", func(ctx context.Context, c *Comm) error {
			x := f64(t, 1)
			if c.Rank() == 2 {
				x = f64(t, ones(70000)...)
			}
			_, err := c.Allreduce(ctx, x, Sum)
			return err
		}},
		{"9000 dimensions", "9000 dimensions", func(ctx context.Context, c *Comm) error {
			_, err := c.Allreduce(ctx, f64(t, ones(9000)...), Sum)
			return err
		}},
	}
	for name, comms := range checkGroups(t, 3) {
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) { failsAlike(t, comms, ErrArgument, tc.says, tc.run) })
		}
	}
}

// TestRequest_WaitTwice: a second Wait is ErrWaited; the first one's
// result stands.
func TestRequest_WaitTwice(t *testing.T) {
	for _, tr := range transports() {
		for _, n := range []int{3, 1 << 14} { // inline; by reference through shared mappings
			t.Run(fmt.Sprintf("%s/%d", tr, n), func(t *testing.T) {
				comms := group(t, 2, tr)
				all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					x := f64(t, n)
					var r *Request
					if c.Rank() == 0 {
						r = c.Isend(ctx, x, 1, 5)
					} else {
						r = c.Irecv(ctx, x, 0, 5)
					}
					if err := r.Wait(ctx); err != nil {
						return 0, err
					}
					if err := r.Wait(ctx); !errors.Is(err, ErrWaited) {
						t.Errorf("rank %d: second Wait: %v, want ErrWaited", c.Rank(), err)
					}
					return 0, nil
				})
			})
		}
	}
}

// TestRecv_Mismatch: a receive into a tensor of another shape fails on
// both sides with ErrMismatch, and the next message goes through.
func TestRecv_Mismatch(t *testing.T) {
	for _, tr := range transports() {
		for _, n := range []int{3, 1 << 14} { // inline; by reference through shared mappings
			t.Run(fmt.Sprintf("%s/%d", tr, n), func(t *testing.T) {
				comms := group(t, 2, tr)
				_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					if c.Rank() == 0 {
						return 0, c.Send(ctx, f64(t, n), 1, 0)
					}
					return 0, c.Recv(ctx, f64(t, n+1), 0, 0)
				})
				for r, err := range errs {
					if !errors.Is(err, ErrMismatch) {
						t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
					}
				}
				all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					if c.Rank() == 0 {
						return 0, c.Send(ctx, f64(t, n), 1, 0)
					}
					return 0, c.Recv(ctx, f64(t, n), 0, 0)
				})
			})
		}
	}
}

// TestP2P_Order: messages with one tag arrive in the order sent, inline
// or by reference (every other message over 64 KiB).
func TestP2P_Order(t *testing.T) {
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			comms := group(t, 2, tr)
			size := func(i int) int { return 1 + (i%2)*(1<<14) }
			all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
				const k = 20
				if c.Rank() == 0 {
					var rs []*Request
					for i := range k {
						v := make([]int64, size(i))
						for j := range v {
							v[j] = int64(i)
						}
						x, _ := tensordict.FromSlice(v)
						rs = append(rs, c.Isend(ctx, x, 1, 9))
					}
					for _, r := range rs {
						if err := r.Wait(ctx); err != nil {
							return 0, err
						}
					}
					return 0, nil
				}
				for i := range k {
					x, _ := tensordict.FromSlice(make([]int64, size(i)))
					if err := c.Recv(ctx, x, 0, 9); err != nil {
						return 0, err
					}
					if v, _ := tensordict.Values[int64](x); v[0] != int64(i) || v[len(v)-1] != int64(i) {
						t.Errorf("message %d carries %d", i, v[0])
					}
				}
				return 0, nil
			})
		})
	}
}

// TestErrors_SayOnceWhichRankFailed: rank 2 of 3 breaks off a collective
// (its context ends while it waits), on both transports. Rank 2's error is
// its context's, saying it broke off (not "abandoned by another rank");
// the others' later calls fail with ErrBroken (and ErrAborted) saying once
// that rank 2 broke off, and why, with one "rpc: Code: " prefix. Before,
// the others' messages held rank 2's twice, each behind its own prefixes,
// and rank 2 was told another rank had abandoned the operation.
func TestErrors_SayOnceWhichRankFailed(t *testing.T) {
	x, _ := tensordict.FromSlice(make([]float64, 1<<10))
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			comms := group(t, 3, tr)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			_, err := comms[2].Allreduce(ctx, x, Sum)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrAborted) ||
				!strings.Contains(err.Error(), "rank 2 (this rank) broke off") {
				t.Errorf("rank 2, whose context ended: %v; want its context's error saying it broke off", err)
			}
			time.Sleep(100 * time.Millisecond) // the others' watches hear of it
			for r, c := range comms {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := c.Allreduce(ctx, x, Sum)
				cancel()
				msg := fmt.Sprint(err)
				if !errors.Is(err, ErrBroken) || strings.Count(msg, "rpc: ") != 1 {
					t.Errorf("rank %d's next call: %s; want ErrBroken with one rpc prefix", r, msg)
				}
				if r == 2 {
					if strings.Contains(msg, "another rank") || !strings.Contains(msg, "rank 2 (this rank) broke off") {
						t.Errorf("rank 2's next call: %s; want it to say that this rank broke off", msg)
					}
					continue
				}
				if !errors.Is(err, ErrAborted) || strings.Count(msg, "broke off") != 1 ||
					strings.Count(msg, ErrAborted.Error()) != 1 || !strings.Contains(msg, "rank 2 broke off collective 0: context deadline exceeded") {
					t.Errorf("rank %d's next call: %s; want ErrAborted saying once that rank 2 broke off, and why", r, msg)
				}
			}
		})
	}
}
