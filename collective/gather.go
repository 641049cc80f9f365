package collective

import (
	"context"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Gather and Allgather: the root (Gather) or every rank (Allgather) gets
// every rank's tensor, concatenated along the axis in rank order.

const (
	kindGather    kind = 4
	kindAllgather kind = 5
)

func gatherShape(p *plan, r int) []int {
	if r != p.root {
		return nil
	}
	return allgatherShape(p, r)
}

func allgatherShape(p *plan, r int) []int { return along(p.shapes[r], p.axis, sum(p.sizes)) }

// publishGather publishes every input but the root's, which only the root
// reads.
func publishGather(s *shmPub) error {
	if s.c.rank == s.d.root {
		return nil
	}
	return s.all()
}

// shmGather copies every rank's mapping into place.
func shmGather(_ context.Context, s *shmRun) error {
	p, out := s.p, s.out
	if out == nil {
		return nil
	}
	oshape := p.outShape(s.c.rank)
	pre := prefix(p.sizes)
	for r := range s.c.size {
		b, err := s.src(r)
		if err != nil {
			return err
		}
		boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), b, p.shapes[r], zeros(len(oshape)), p.shapes[r], p.esize)
	}
	return nil
}

// tcpGather stages every rank's tensor as a block, gathers the blocks
// around the ring (Allgather) or at the root (Gather), and puts them in
// place.
func tcpGather(x *xfer, p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	blocks := make([]int, n+1)
	for r := range n {
		blocks[r+1] = blocks[r] + p.bytes(r)
	}
	stage := make([]byte, blocks[n])
	copy(stage[blocks[me]:], in)
	var err error
	if p.kind == kindAllgather {
		err = x.ringAllgather(stage, blocks)
	} else {
		err = x.gatherBlocks(p.root, stage, blocks, stage)
	}
	if err != nil || out == nil {
		return err
	}
	oshape := p.outShape(me)
	pre := prefix(p.sizes)
	for r := range n {
		boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), stage[blocks[r]:blocks[r+1]], p.shapes[r], zeros(len(oshape)), p.shapes[r], es)
	}
	return nil
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
	return c.runInto(ctx, allgatherCall(t, axis), dst)
}

// GatherAdjoint is the adjoint of Gather(axis, root): the root's gradient
// scattered along axis in the forward's sizes (each rank's input's length
// along axis, sizes[r] for rank r).
func (c *Comm) GatherAdjoint(ctx context.Context, grad *tensordict.Tensor, axis int, sizes []int, root int) (*tensordict.Tensor, error) {
	return c.Scatter(ctx, grad, axis, sizes, root)
}

// AllgatherAdjoint is the adjoint of Allgather(axis): ReduceScatter(Sum)
// of the gradient along axis in the forward's sizes. (mpi4torch's own
// backward scatters from rank 1 for every piece after the first, which is
// right only when every rank's gradient is the same.)
func (c *Comm) AllgatherAdjoint(ctx context.Context, grad *tensordict.Tensor, axis int, sizes []int) (*tensordict.Tensor, error) {
	return c.ReduceScatter(ctx, grad, Sum, axis, sizes)
}

// Gather is Comm.Gather on the tape.
func (tp *Tape) Gather(ctx context.Context, x *Var, axis, root int) (*Var, error) {
	return tp.collective(ctx, "Gather", x, gatherCall(value(x), axis, root), func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error) {
		if tp.c.rank != root {
			g = nil
		}
		return tp.c.GatherAdjoint(ctx, g, axis, p.sizes, root)
	})
}

// Allgather is Comm.Allgather on the tape.
func (tp *Tape) Allgather(ctx context.Context, x *Var, axis int) (*Var, error) {
	return tp.collective(ctx, "Allgather", x, allgatherCall(value(x), axis), func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error) {
		return tp.c.AllgatherAdjoint(ctx, g, axis, p.sizes)
	})
}
