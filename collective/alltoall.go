package collective

import (
	"context"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Alltoall: rank r gets piece r (along the scatter axis) of every rank's
// tensor, concatenated along the gather axis in rank order.

const kindAlltoall kind = 7

func alltoallShape(p *plan, r int) []int {
	s := along(p.shapes[r], p.axis2, p.counts[r])
	s[p.axis] = sum(p.sizes)
	return s
}

// shmAlltoall copies this rank's piece of every rank's mapping into place.
func shmAlltoall(_ context.Context, s *shmRun) error {
	p, me := s.p, s.c.rank
	oshape := p.outShape(me)
	pre, cpre := prefix(p.sizes), prefix(p.counts)
	for r := range s.c.size {
		b, err := s.src(r)
		if err != nil {
			return err
		}
		box := along(p.shapes[r], p.axis2, p.counts[me])
		boxCopy(s.out, oshape, at(len(oshape), p.axis, pre[r]), b, p.shapes[r], at(len(oshape), p.axis2, cpre[me]), box, p.esize)
	}
	return nil
}

func alltoallCall(t *tensordict.Tensor, gatherAxis, scatterAxis int, counts []int) *call {
	d, in := describe(kindAlltoall, t)
	d.axis, d.axis2, d.counts = gatherAxis, scatterAxis, counts
	return &call{d: d, in: in}
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
	return c.runInto(ctx, alltoallCall(t, gatherAxis, scatterAxis, counts), dst)
}

// AlltoallAdjoint is the adjoint of Alltoall(gatherAxis, scatterAxis,
// counts): Alltoall with the axes swapped, split in the forward's sizes
// along gatherAxis.
func (c *Comm) AlltoallAdjoint(ctx context.Context, grad *tensordict.Tensor, gatherAxis, scatterAxis int, sizes []int) (*tensordict.Tensor, error) {
	return c.Alltoall(ctx, grad, scatterAxis, gatherAxis, sizes)
}

// Alltoall is Comm.Alltoall on the tape.
func (tp *Tape) Alltoall(ctx context.Context, x *Var, gatherAxis, scatterAxis int, counts []int) (*Var, error) {
	return tp.collective(ctx, "Alltoall", x, alltoallCall(value(x), gatherAxis, scatterAxis, counts), func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error) {
		return tp.c.AlltoallAdjoint(ctx, g, gatherAxis, scatterAxis, p.sizes)
	})
}

// alltoall sends every rank its piece of this rank's tensor and places the
// pieces it gets.
func (x *xfer) alltoall(p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	oshape := p.outShape(me)
	pre, cpre := prefix(p.sizes), prefix(p.counts)
	shape := p.shapes[me]
	stages := make([][]byte, n)
	waits := make([]func(context.Context) error, n)
	for r := range n {
		if r == me {
			continue
		}
		box := along(p.shapes[r], p.axis2, p.counts[me])
		stages[r] = make([]byte, numel(box)*es)
		waits[r] = x.c.postBytes(r, x.key(r, 0), len(stages[r]), into(stages[r]))
	}
	errs := make(chan error, n)
	for r := range n {
		box := along(shape, p.axis2, p.counts[r])
		piece := make([]byte, numel(box)*es)
		boxCopy(piece, box, zeros(len(box)), in, shape, at(len(shape), p.axis2, cpre[r]), box, es)
		if r == me {
			stages[r] = piece
			continue
		}
		go func() { errs <- x.c.sendBytes(x.ctx, r, x.key(me, 0), piece) }()
	}
	var first error
	for r := range n {
		if r == me {
			continue
		}
		if err := waits[r](x.ctx); err != nil && first == nil {
			first = err
		}
	}
	for r := 0; r < n-1; r++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	for r := range n {
		box := along(p.shapes[r], p.axis2, p.counts[me])
		boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), stages[r], box, zeros(len(box)), box, es)
	}
	return nil
}
