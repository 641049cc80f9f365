package collective

import (
	"context"
	"math/bits"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Allreduce: every rank gets the reduction of every rank's tensor.

const kindAllreduce kind = 1

// publishReduce publishes an Allreduce's or a Reduce's input: all of a
// small Allreduce, which every rank reduces whole; otherwise nothing but
// the data file's size (the pipelined reduction copies its input in chunk
// by chunk in the data phase, shm_pipe.go).
func publishReduce(s *shmPub) error {
	d, in := s.d, s.in
	if !Supported(d.dtype) {
		return nil
	}
	if pipelined(d.kind, len(in)) {
		return publishPipe(s)
	}
	buf, err := s.c.shm.publish(s.set, len(in))
	if err != nil {
		return err
	}
	copy(buf, in) // every rank reduces all of it
	return nil
}

// shmReduce is Allreduce and Reduce through the shared mappings: the
// pipelined reduction (shm_pipe.go), or, for an Allreduce of smallShm
// bytes or less, every rank reducing the whole tensor from every mapping
// in rank order (the same bits everywhere), which needs no wait after the
// publish.
func shmReduce(ctx context.Context, s *shmRun) error {
	g, p, in, out := s.g, s.p, s.in, s.out
	me := s.c.rank
	if pipelined(p.kind, p.bytes(me)) {
		return shmPipeReduce(ctx, s)
	}
	srcs, err := s.srcs()
	if err != nil {
		return err
	}
	if sameMem(out, in) {
		srcs[me], _ = g.peerData(me, s.set, p.bytes(me)) // our published copy
	}
	reduceN(p.op, p.dt, out, srcs)
	return nil
}

// tcpAllreduce is recursive doubling for a small tensor, a ring
// reduce-scatter and allgather for a large one.
func tcpAllreduce(x *xfer, p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	if len(out) <= smallAllreduce || numel(p.shapes[me]) < n {
		if !sameMem(out, in) {
			copy(out, in)
		}
		return x.doubling(p, out)
	}
	// The ring reads this rank's input where it is: out of place, no
	// copy into out first.
	blocks := scale(chunks(numel(p.shapes[me]), n), es)
	if n <= directMax {
		return x.direct(p, in, out, blocks)
	}
	return x.ring(p, in, out, blocks, true, true)
}

func allreduceCall(t *tensordict.Tensor, op Op) *call {
	d, in := describe(kindAllreduce, t)
	d.op = op
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
	return c.runInto(ctx, allreduceCall(t, op), dst)
}

// AllreduceAdjoint is the adjoint of Allreduce(op): Allreduce(Sum) of the
// gradient, for op Sum.
func (c *Comm) AllreduceAdjoint(ctx context.Context, grad *tensordict.Tensor, op Op) (*tensordict.Tensor, error) {
	if op != Sum {
		return nil, noAdjoint("Allreduce", op)
	}
	return c.Allreduce(ctx, grad, Sum)
}

// Allreduce is Comm.Allreduce on the tape.
func (tp *Tape) Allreduce(ctx context.Context, x *Var, op Op) (*Var, error) {
	return tp.allreduce(ctx, x, op, false, nil)
}

// AllreduceInto is Comm.AllreduceInto on the tape: the forward writes the
// result into dst, a tensor the caller keeps (a training loop's buffer,
// reused from step to step, so that the forward allocates nothing), and
// the returned Var's value is dst. dst may be x's own tensor (in place:
// Allreduce's adjoint does not need x's value). The tape neither copies
// nor writes dst after the forward.
func (tp *Tape) AllreduceInto(ctx context.Context, dst *tensordict.Tensor, x *Var, op Op) (*Var, error) {
	return tp.allreduce(ctx, x, op, true, dst)
}

func (tp *Tape) allreduce(ctx context.Context, x *Var, op Op, into bool, dst *tensordict.Tensor) (*Var, error) {
	return tp.collectiveOwned(ctx, "Allreduce", x, allreduceCall(value(x), op), into, dst, func(ctx context.Context, p *plan, g *tensordict.Tensor, owned bool) (*tensordict.Tensor, error) {
		if op != Sum {
			return nil, noAdjoint("Allreduce", op)
		}
		if !owned {
			// The caller's seed, or a Func's gradient: not ours to
			// write. Out of place, into a new tensor (no copy first).
			return tp.c.Allreduce(ctx, g, Sum)
		}
		// g is the tape's own (the output's gradient, released after
		// this): reduce it in place.
		return g, tp.c.AllreduceInto(ctx, g, g, Sum)
	})
}

// doubling is recursive-doubling allreduce of acc, after MPICH: with n not
// a power of two, the first 2*rem ranks fold in pairs first and the odd
// ones hand the result back at the end. A pair always combines the lower
// ranks' value first, so every rank computes the same bits.
func (x *xfer) doubling(p *plan, acc []byte) error {
	me, n := x.c.rank, x.c.size
	p2 := 1 << (bits.Len(uint(n)) - 1)
	rem := n - p2
	tmp := make([]byte, len(acc))
	combine := func(partner int) {
		if partner < me {
			reduceN(p.op, p.dt, acc, [][]byte{tmp, acc})
		} else {
			reduceN(p.op, p.dt, acc, [][]byte{acc, tmp})
		}
	}
	newrank := me - rem
	if me < 2*rem {
		if me%2 == 0 {
			if err := x.exchange(me+1, acc, -1, 0, nil); err != nil {
				return err
			}
			newrank = -1
		} else {
			if err := x.exchange(-1, nil, me-1, len(acc), into(tmp)); err != nil {
				return err
			}
			combine(me - 1)
			newrank = me / 2
		}
	} else {
		x.step++ // keep the step numbers in line with the folding ranks
	}
	for mask := 1; mask < p2; mask <<= 1 {
		if newrank < 0 {
			x.step++
			continue
		}
		pn := newrank ^ mask
		partner := pn + rem
		if pn < rem {
			partner = pn*2 + 1
		}
		if err := x.exchange(partner, acc, partner, len(acc), into(tmp)); err != nil {
			return err
		}
		combine(partner)
	}
	if me < 2*rem {
		if me%2 == 1 {
			return x.exchange(me-1, acc, -1, 0, nil)
		}
		return x.exchange(-1, nil, me+1, len(acc), into(acc))
	}
	return nil
}
