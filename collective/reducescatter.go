package collective

import (
	"context"

	"github.com/tensorwire/tensorwire/tensordict"
)

// ReduceScatter: rank r gets piece r (along the axis) of the reduction of
// every rank's tensor.

const kindReduceScatter kind = 8

func reduceScatterShape(p *plan, r int) []int { return along(p.shapes[r], p.axis, p.counts[r]) }

// shmReduceScatter reduces this rank's piece from every rank's mapping:
// pipelined in chunks (shm_rspipe.go) above smallShm bytes a rank, from
// the whole published inputs at or below.
func shmReduceScatter(ctx context.Context, s *shmRun) error {
	p, out := s.p, s.out
	me, n, es := s.c.rank, s.c.size, p.esize
	if pipelinedRS(p.bytes(me)) {
		return shmRSPipe(ctx, s)
	}
	shape := p.shapes[me]
	box := p.outShape(me)
	off := at(len(shape), p.axis, prefix(p.counts)[me])
	bufs, err := s.srcs()
	if err != nil {
		return err
	}
	srcs := make([][]byte, n)
	boxRuns([][]int{box, shape}, [][]int{zeros(len(box)), off}, box, es, func(a []int, k int) {
		for r := range n {
			srcs[r] = bufs[r][a[1] : a[1]+k]
		}
		reduceN(p.op, p.dt, out[a[0]:a[0]+k], srcs)
	})
	return nil
}

// tcpReduceScatter lays the pieces out one after the other,
// reduce-scatters them around the ring, and ours is the result.
func tcpReduceScatter(x *xfer, p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	shape := p.shapes[me]
	acc := make([]byte, len(in))
	pre := prefix(p.counts)
	blocks := make([]int, n+1)
	for r := range n {
		box := along(shape, p.axis, p.counts[r])
		boxCopy(acc[blocks[r]:], box, zeros(len(box)), in, shape, at(len(shape), p.axis, pre[r]), box, es)
		blocks[r+1] = blocks[r] + numel(box)*es
	}
	if err := x.ringReduceScatter(p, acc, blocks); err != nil {
		return err
	}
	copy(out, acc[blocks[me]:blocks[me+1]])
	return nil
}

func reduceScatterCall(t *tensordict.Tensor, op Op, axis int, counts []int) *call {
	d, in := describe(kindReduceScatter, t)
	d.op, d.axis, d.counts = op, axis, counts
	return &call{d: d, in: in}
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
	return c.runInto(ctx, reduceScatterCall(t, op, axis, counts), dst)
}

// ReduceScatterAdjoint is the adjoint of ReduceScatter(op, axis, counts),
// for op Sum: Allgather of the gradient along axis.
func (c *Comm) ReduceScatterAdjoint(ctx context.Context, grad *tensordict.Tensor, op Op, axis int) (*tensordict.Tensor, error) {
	if op != Sum {
		return nil, noAdjoint("ReduceScatter", op)
	}
	return c.Allgather(ctx, grad, axis)
}

// ReduceScatter is Comm.ReduceScatter on the tape.
func (tp *Tape) ReduceScatter(ctx context.Context, x *Var, op Op, axis int, counts []int) (*Var, error) {
	return tp.collective(ctx, "ReduceScatter", x, reduceScatterCall(value(x), op, axis, counts), func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error) {
		return tp.c.ReduceScatterAdjoint(ctx, g, op, axis)
	})
}
