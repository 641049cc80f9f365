package collective

import (
	"context"
	"fmt"

	"github.com/tensorwire/tensorwire/tensordict"
)

// The collectives. Every rank of the communicator calls the same one, in
// the same order, with arguments that fit together; each returns this
// rank's result. Tensors may be in Go memory or mapped (tensordict); the
// results are new tensors in Go memory, except with the Into calls, which
// write into a tensor the caller gives (of the result's dtype and shape;
// it may be the input where the call says so).
//
// Every call is checked on every rank before any data moves: a bad
// argument on one rank (ErrArgument) or arguments that do not fit together
// (ErrMismatch) fail the call on every rank, each with the same error, and
// the communicator stays usable. ctx bounds the call; when it ends part-way,
// or a rank is lost, the call fails (ErrAborted, ErrPeerLost, or ctx's
// error) and the communicator is broken (ErrBroken).

// describe fills a desc from a tensor.
func describe(k kind, t *tensordict.Tensor) (desc, []byte) {
	d := desc{kind: k}
	if t == nil {
		return d, nil
	}
	d.hasT, d.dtype, d.shape = true, t.DType(), t.Shape()
	b, err := t.Bytes()
	if err != nil {
		d.bad = err.Error()
		return d, nil
	}
	return d, b
}

// withOut records the output tensor dst in cl.
func withOut(cl *call, dst *tensordict.Tensor) {
	if dst == nil {
		cl.d.bad = "no output tensor"
		return
	}
	cl.d.hasOut, cl.d.outDT, cl.d.out = true, dst.DType(), dst.Shape()
	b, err := dst.Bytes()
	if err != nil {
		cl.d.bad = fmt.Sprintf("output: %v", err)
		return
	}
	if b == nil {
		b = []byte{}
	}
	cl.out = b
}

// result wraps this rank's output bytes as a tensor.
func result(p *plan, me int, out []byte) (*tensordict.Tensor, error) {
	shape := p.outShape(me)
	if shape == nil {
		return nil, nil
	}
	return tensordict.FromBytes(p.dt, shape, out)
}

func (c *Comm) run(ctx context.Context, cl *call) (*tensordict.Tensor, *plan, error) {
	p, out, err := c.collective(ctx, cl)
	if err != nil {
		return nil, nil, err
	}
	if cl.out != nil {
		return nil, p, nil
	}
	t, err := result(p, c.rank, out)
	return t, p, err
}

// The calls of the collectives, built from their arguments.

func allreduceCall(t *tensordict.Tensor, op Op) *call {
	d, in := describe(kindAllreduce, t)
	d.op = op
	return &call{d: d, in: in}
}

func bcastCall(t *tensordict.Tensor, root, me int) *call {
	d, in := describe(kindBcast, t)
	d.root = root
	if me != root {
		in = nil
	}
	return &call{d: d, in: in}
}

func reduceCall(t *tensordict.Tensor, op Op, root int) *call {
	d, in := describe(kindReduce, t)
	d.op, d.root = op, root
	return &call{d: d, in: in}
}

func gatherCall(t *tensordict.Tensor, axis, root int) *call {
	d, in := describe(kindGather, t)
	d.axis, d.root = axis, root
	return &call{d: d, in: in}
}

func allgatherCall(t *tensordict.Tensor, axis int) *call {
	d, in := describe(kindAllgather, t)
	d.axis = axis
	return &call{d: d, in: in}
}

func scatterCall(t *tensordict.Tensor, axis int, counts []int, root, me int) *call {
	d, in := describe(kindScatter, t)
	d.axis, d.root, d.counts = axis, root, counts
	if me != root {
		d.hasT, in = false, nil
	}
	return &call{d: d, in: in}
}

func alltoallCall(t *tensordict.Tensor, gatherAxis, scatterAxis int, counts []int) *call {
	d, in := describe(kindAlltoall, t)
	d.axis, d.axis2, d.counts = gatherAxis, scatterAxis, counts
	return &call{d: d, in: in}
}

func reduceScatterCall(t *tensordict.Tensor, op Op, axis int, counts []int) *call {
	d, in := describe(kindReduceScatter, t)
	d.op, d.axis, d.counts = op, axis, counts
	return &call{d: d, in: in}
}

// Allreduce returns, on every rank, the reduction with op of every rank's
// t (same dtype and shape on every rank), elementwise, in rank order.
func (c *Comm) Allreduce(ctx context.Context, t *tensordict.Tensor, op Op) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, allreduceCall(t, op))
	return r, err
}

// AllreduceInto is Allreduce writing the result into dst, which may be t
// itself (in place).
func (c *Comm) AllreduceInto(ctx context.Context, dst, t *tensordict.Tensor, op Op) error {
	cl := allreduceCall(t, op)
	withOut(cl, dst)
	_, _, err := c.run(ctx, cl)
	return err
}

// Bcast returns the root's t on every rank. Other ranks may pass nil, or a
// tensor of the root's dtype and shape (which is not changed).
func (c *Comm) Bcast(ctx context.Context, t *tensordict.Tensor, root int) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, bcastCall(t, root, c.rank))
	return r, err
}

// BcastInto broadcasts in place, as MPI_Bcast: the root sends t, and every
// other rank receives into its t (of the root's dtype and shape).
func (c *Comm) BcastInto(ctx context.Context, t *tensordict.Tensor, root int) error {
	cl := bcastCall(t, root, c.rank)
	withOut(cl, t)
	_, _, err := c.run(ctx, cl)
	return err
}

// Reduce returns on the root the reduction with op of every rank's t, and
// zeros of t's shape on the other ranks (as mpi4torch's Reduce_).
func (c *Comm) Reduce(ctx context.Context, t *tensordict.Tensor, op Op, root int) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, reduceCall(t, op, root))
	return r, err
}

// ReduceInto is Reduce writing into dst (the root's result, zeros
// elsewhere); dst may be t.
func (c *Comm) ReduceInto(ctx context.Context, dst, t *tensordict.Tensor, op Op, root int) error {
	cl := reduceCall(t, op, root)
	withOut(cl, dst)
	_, _, err := c.run(ctx, cl)
	return err
}

// Gather returns on the root every rank's t concatenated along axis, in
// rank order, and nil on the other ranks. The tensors must agree in dtype
// and in every dimension but axis, whose sizes may differ (MPI's
// Gatherv).
func (c *Comm) Gather(ctx context.Context, t *tensordict.Tensor, axis, root int) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, gatherCall(t, axis, root))
	return r, err
}

// GatherInto is Gather writing the root's result into dst; other ranks may
// pass any dst (nil included), which is left alone.
func (c *Comm) GatherInto(ctx context.Context, dst, t *tensordict.Tensor, axis, root int) error {
	cl := gatherCall(t, axis, root)
	if c.rank == root {
		withOut(cl, dst)
	}
	_, _, err := c.run(ctx, cl)
	return err
}

// Allgather returns on every rank every rank's t concatenated along axis,
// in rank order; sizes along axis may differ between ranks.
func (c *Comm) Allgather(ctx context.Context, t *tensordict.Tensor, axis int) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, allgatherCall(t, axis))
	return r, err
}

// AllgatherInto is Allgather writing into dst.
func (c *Comm) AllgatherInto(ctx context.Context, dst, t *tensordict.Tensor, axis int) error {
	cl := allgatherCall(t, axis)
	withOut(cl, dst)
	_, _, err := c.run(ctx, cl)
	return err
}

// Scatter splits the root's t along axis into pieces of counts[r] (nil:
// equal pieces; the axis must divide evenly) and returns piece r on rank
// r. Other ranks may pass nil for t, and nil counts (or the root's).
func (c *Comm) Scatter(ctx context.Context, t *tensordict.Tensor, axis int, counts []int, root int) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, scatterCall(t, axis, counts, root, c.rank))
	return r, err
}

// ScatterInto is Scatter writing this rank's piece into dst.
func (c *Comm) ScatterInto(ctx context.Context, dst, t *tensordict.Tensor, axis int, counts []int, root int) error {
	cl := scatterCall(t, axis, counts, root, c.rank)
	withOut(cl, dst)
	_, _, err := c.run(ctx, cl)
	return err
}

// Alltoall splits every rank's t along scatterAxis into pieces of
// counts[r] (nil: equal pieces), sends piece r to rank r, and returns the
// pieces this rank gets concatenated along gatherAxis in rank order. The
// axes must differ; the tensors agree in every dimension but gatherAxis,
// whose sizes may differ; counts is the same on every rank.
func (c *Comm) Alltoall(ctx context.Context, t *tensordict.Tensor, gatherAxis, scatterAxis int, counts []int) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, alltoallCall(t, gatherAxis, scatterAxis, counts))
	return r, err
}

// AlltoallInto is Alltoall writing into dst.
func (c *Comm) AlltoallInto(ctx context.Context, dst, t *tensordict.Tensor, gatherAxis, scatterAxis int, counts []int) error {
	cl := alltoallCall(t, gatherAxis, scatterAxis, counts)
	withOut(cl, dst)
	_, _, err := c.run(ctx, cl)
	return err
}

// ReduceScatter reduces every rank's t (same dtype and shape) with op and
// returns on rank r piece r of the result split along axis into pieces of
// counts[r] (nil: equal pieces).
func (c *Comm) ReduceScatter(ctx context.Context, t *tensordict.Tensor, op Op, axis int, counts []int) (*tensordict.Tensor, error) {
	r, _, err := c.run(ctx, reduceScatterCall(t, op, axis, counts))
	return r, err
}

// ReduceScatterInto is ReduceScatter writing into dst (not t).
func (c *Comm) ReduceScatterInto(ctx context.Context, dst, t *tensordict.Tensor, op Op, axis int, counts []int) error {
	cl := reduceScatterCall(t, op, axis, counts)
	withOut(cl, dst)
	_, _, err := c.run(ctx, cl)
	return err
}

// Barrier returns once every rank has called it.
func (c *Comm) Barrier(ctx context.Context) error {
	_, _, err := c.collective(ctx, &call{d: desc{kind: kindBarrier}})
	return err
}
