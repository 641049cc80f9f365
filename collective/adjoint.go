package collective

import (
	"context"

	"github.com/tensorwire/tensorwire/tensordict"
)

// The adjoints. Each operation's adjoint maps the gradient of its output
// (on each rank) to the gradient of its input (on each rank), under the
// convention that the loss is the sum of every rank's own loss
// (mpi4torch's and torch.distributed.nn's): for a collective A, the
// adjoint A* satisfies, with x and y any per-rank tensors,
//
//	sum over ranks r of <A(x)_r, y_r> = sum over ranks r of <x_r, A*(y)_r>
//
// which the package's tests check for every operation at 2, 3 and 4 ranks.
// Every rank calls the adjoint (it is a collective too), in the same order;
// a gradient that is nil where the forward's output was nil (Gather off
// the root) is fine. Only Sum reductions are linear: the adjoint of any
// other fails with ErrNoAdjoint, on every rank (torch.distributed.nn
// silently uses the forward's operation instead).

func noAdjoint(what string, op Op) error {
	return errorf(ErrNoAdjoint, "%s with %v has no adjoint (only Sum is linear)", what, op)
}

// SendAdjoint is the adjoint of Send(t, dest, tag): it receives the
// gradient of t from dest (whose RecvAdjoint sends it) into a new tensor
// of t's dtype and shape.
func (c *Comm) SendAdjoint(ctx context.Context, t *tensordict.Tensor, dest, tag int) (*tensordict.Tensor, error) {
	if t == nil {
		return nil, argumentf("SendAdjoint on rank %d: no tensor", c.rank)
	}
	g, err := tensordict.Zeros(t.DType(), t.Shape()...)
	if err != nil {
		return nil, err
	}
	if err := c.Recv(ctx, g, dest, tag); err != nil {
		return nil, err
	}
	return g, nil
}

// RecvAdjoint is the adjoint of Recv(t, src, tag): it sends the gradient
// of the received tensor back to src. The receive buffer's own gradient is
// zero (what it held was overwritten); mpi4torch returns the gradient
// itself there.
func (c *Comm) RecvAdjoint(ctx context.Context, grad *tensordict.Tensor, src, tag int) error {
	return c.Send(ctx, grad, src, tag)
}
