package collective

import (
	"context"
	"errors"
	"fmt"
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
