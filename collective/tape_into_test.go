package collective

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

// TestTape_IntoAndInPlace: a training loop's buffers, reused step after
// step, go through the tape without a new tensor: Tape.AllreduceInto
// writes the forward's result into the caller's tensor (the output Var's
// value is that tensor), and BackwardInPlace reduces the caller's seed
// where it is, so the leaf's gradient is the seed itself; both give the
// values Allreduce and Backward give. A nil output fails on every rank
// with ErrArgument, and the communicator goes on.
func TestTape_IntoAndInPlace(t *testing.T) {
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			const n = 3
			comms := group(t, n, tr)
			sizes := []int{1000, 70_000} // the small and the large algorithms
			if raceEnabled && tr == TCP {
				// In place over TCP with ranks in one process, a rank's
				// send of a block and its receive of the reduced block
				// into the same memory are ordered through the sockets
				// only, which the race detector does not see: it
				// reports a race that is not there.
				sizes = sizes[:1]
			}
			for _, elems := range sizes {
				all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					r := c.Rank()
					out := filled(t, elems, -1)
					seed := filled(t, elems, float64(r+1))
					for step := range 2 { // the same buffers twice
						tp := NewTape(c)
						x := tp.Leaf(filled(t, elems, float64(r)))
						y, err := tp.AllreduceInto(ctx, out, x, Sum)
						if err != nil {
							return 0, err
						}
						if y.Value() != out {
							return 0, fmt.Errorf("step %d: the output's value is not the caller's tensor", step)
						}
						if err := isAll(out, 0+1+2); err != nil {
							return 0, fmt.Errorf("step %d: forward: %v", step, err)
						}
						want := float64(1 + 2 + 3)
						if step == 1 {
							// Reduced in place at step 0, not refilled.
							want = n * want
						}
						if err := tp.BackwardInPlace(ctx, y, seed); err != nil {
							return 0, err
						}
						if x.Grad() != seed {
							return 0, fmt.Errorf("step %d: the leaf's gradient is not the seed", step)
						}
						if err := isAll(seed, want); err != nil {
							return 0, fmt.Errorf("step %d: gradient: %v", step, err)
						}
						// In place: the output is the input.
						tp = NewTape(c)
						in := filled(t, elems, 1)
						x = tp.Leaf(in)
						if y, err = tp.AllreduceInto(ctx, in, x, Sum); err != nil {
							return 0, err
						}
						if err := isAll(in, n); err != nil {
							return 0, fmt.Errorf("step %d: in place: %v", step, err)
						}
						if err := tp.BackwardInPlace(ctx, y, nil); err != nil {
							return 0, err
						}
						if err := isAll(x.Grad(), n); err != nil {
							return 0, fmt.Errorf("step %d: gradient of ones: %v", step, err)
						}
					}
					return 0, nil
				})
			}
			_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (*Var, error) {
				tp := NewTape(c)
				var dst *tensordict.Tensor
				if c.Rank() == 1 {
					return tp.AllreduceInto(ctx, dst, tp.Leaf(filled(t, 8, 1)), Sum)
				}
				return tp.AllreduceInto(ctx, filled(t, 8, 0), tp.Leaf(filled(t, 8, 1)), Sum)
			})
			for r, err := range errs {
				if !errors.Is(err, ErrArgument) {
					t.Errorf("rank %d, a nil output on rank 1: %v, want ErrArgument", r, err)
				}
			}
			all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
				return c.Allreduce(ctx, filled(t, 8, 1), Sum)
			})
		})
	}
}
