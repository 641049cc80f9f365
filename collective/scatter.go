package collective

import (
	"context"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Scatter: rank r gets piece r (along the axis) of the root's tensor.

const kindScatter kind = 6

func scatterShape(p *plan, r int) []int { return along(p.shapes[p.root], p.axis, p.counts[r]) }

// shmScatter copies this rank's piece of the root's mapping.
func shmScatter(_ context.Context, s *shmRun) error {
	p := s.p
	b, err := s.src(p.root)
	if err != nil {
		return err
	}
	oshape := p.outShape(s.c.rank)
	boxCopy(s.out, oshape, zeros(len(oshape)), b, p.shapes[p.root], at(len(oshape), p.axis, prefix(p.counts)[s.c.rank]), oshape, p.esize)
	return nil
}

func scatterCall(t *tensordict.Tensor, axis int, counts []int, root, me int) *call {
	d, in := describe(kindScatter, t)
	d.axis, d.root, d.counts = axis, root, counts
	if me != root {
		d.hasT, in = false, nil
	}
	return &call{d: d, in: in}
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
	return c.runInto(ctx, scatterCall(t, axis, counts, root, c.rank), dst)
}

// ScatterAdjoint is the adjoint of Scatter(axis, counts, root): every
// rank's gradient gathered along axis at the root, which gets its input's
// gradient; the other ranks get nil (their input did not count).
func (c *Comm) ScatterAdjoint(ctx context.Context, grad *tensordict.Tensor, axis, root int) (*tensordict.Tensor, error) {
	return c.Gather(ctx, grad, axis, root)
}

// Scatter is Comm.Scatter on the tape.
func (tp *Tape) Scatter(ctx context.Context, x *Var, axis int, counts []int, root int) (*Var, error) {
	return tp.collective(ctx, "Scatter", x, scatterCall(value(x), axis, counts, root, tp.c.rank), func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error) {
		gi, err := tp.c.ScatterAdjoint(ctx, g, axis, root)
		if err == nil && tp.c.rank != root && value(x) != nil {
			gi, err = tensordict.Zeros(x.t.DType(), x.t.Shape()...)
		}
		return gi, err
	})
}

// scatter sends each rank its piece of the root's tensor.
func (x *xfer) scatter(p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	shape := p.shapes[p.root]
	pre := prefix(p.counts)
	if me != p.root {
		return x.exchange(-1, nil, p.root, len(out), into(out))
	}
	x.step++
	errs := make(chan error, n)
	for r := range n {
		box := along(shape, p.axis, p.counts[r])
		piece := out
		if r != me {
			piece = make([]byte, numel(box)*es)
		}
		boxCopy(piece, box, zeros(len(box)), in, shape, at(len(shape), p.axis, pre[r]), box, es)
		if r != me {
			go func() { errs <- x.c.sendBytes(x.ctx, r, x.key(me, 0), piece) }()
		}
	}
	var first error
	for r := 0; r < n-1; r++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
