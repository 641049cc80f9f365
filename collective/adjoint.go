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

// AllreduceAdjoint is the adjoint of Allreduce(op): Allreduce(Sum) of the
// gradient, for op Sum.
func (c *Comm) AllreduceAdjoint(ctx context.Context, grad *tensordict.Tensor, op Op) (*tensordict.Tensor, error) {
	if op != Sum {
		return nil, noAdjoint("Allreduce", op)
	}
	return c.Allreduce(ctx, grad, Sum)
}

// BcastAdjoint is the adjoint of Bcast(root): Reduce(Sum, root) of the
// gradient; the root gets the sum, the other ranks zeros (their input did
// not count).
func (c *Comm) BcastAdjoint(ctx context.Context, grad *tensordict.Tensor, root int) (*tensordict.Tensor, error) {
	return c.Reduce(ctx, grad, Sum, root)
}

// ReduceAdjoint is the adjoint of Reduce(op, root), for op Sum: the root's
// gradient broadcast to every rank (the other ranks' outputs were zeros
// that depend on nothing, so their gradients do not count and may be nil).
func (c *Comm) ReduceAdjoint(ctx context.Context, grad *tensordict.Tensor, op Op, root int) (*tensordict.Tensor, error) {
	if op != Sum {
		return nil, noAdjoint("Reduce", op)
	}
	if c.rank != root {
		grad = nil
	}
	return c.Bcast(ctx, grad, root)
}

// GatherAdjoint is the adjoint of Gather(axis, root): the root's gradient
// scattered along axis in the forward's sizes (each rank's input's length
// along axis, sizes[r] for rank r).
func (c *Comm) GatherAdjoint(ctx context.Context, grad *tensordict.Tensor, axis int, sizes []int, root int) (*tensordict.Tensor, error) {
	return c.Scatter(ctx, grad, axis, sizes, root)
}

// ScatterAdjoint is the adjoint of Scatter(axis, counts, root): every
// rank's gradient gathered along axis at the root, which gets its input's
// gradient; the other ranks get nil (their input did not count).
func (c *Comm) ScatterAdjoint(ctx context.Context, grad *tensordict.Tensor, axis, root int) (*tensordict.Tensor, error) {
	return c.Gather(ctx, grad, axis, root)
}

// AllgatherAdjoint is the adjoint of Allgather(axis): ReduceScatter(Sum)
// of the gradient along axis in the forward's sizes. (mpi4torch's own
// backward scatters from rank 1 for every piece after the first, which is
// right only when every rank's gradient is the same.)
func (c *Comm) AllgatherAdjoint(ctx context.Context, grad *tensordict.Tensor, axis int, sizes []int) (*tensordict.Tensor, error) {
	return c.ReduceScatter(ctx, grad, Sum, axis, sizes)
}

// ReduceScatterAdjoint is the adjoint of ReduceScatter(op, axis, counts),
// for op Sum: Allgather of the gradient along axis.
func (c *Comm) ReduceScatterAdjoint(ctx context.Context, grad *tensordict.Tensor, op Op, axis int) (*tensordict.Tensor, error) {
	if op != Sum {
		return nil, noAdjoint("ReduceScatter", op)
	}
	return c.Allgather(ctx, grad, axis)
}

// AlltoallAdjoint is the adjoint of Alltoall(gatherAxis, scatterAxis,
// counts): Alltoall with the axes swapped, split in the forward's sizes
// along gatherAxis.
func (c *Comm) AlltoallAdjoint(ctx context.Context, grad *tensordict.Tensor, gatherAxis, scatterAxis int, sizes []int) (*tensordict.Tensor, error) {
	return c.Alltoall(ctx, grad, scatterAxis, gatherAxis, sizes)
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
