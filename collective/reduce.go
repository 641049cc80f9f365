package collective

import (
	"context"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Reduce: the root gets the reduction of every rank's tensor, the others
// zeros. Through the shared mappings it is Allreduce's algorithm
// (shmReduce, allreduce.go).

const kindReduce kind = 3

// tcpReduce is a ring reduce-scatter, then the blocks gathered at the
// root.
func tcpReduce(x *xfer, p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	acc := make([]byte, len(in))
	copy(acc, in)
	blocks := scale(chunks(numel(p.shapes[me]), n), es)
	if err := x.ringReduceScatter(p, acc, blocks); err != nil {
		return err
	}
	return x.gatherBlocks(p.root, acc, blocks, out)
}

func reduceCall(t *tensordict.Tensor, op Op, root int) *call {
	d, in := describe(kindReduce, t)
	d.op, d.root = op, root
	return &call{d: d, in: in}
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
	return c.runInto(ctx, reduceCall(t, op, root), dst)
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

// Reduce is Comm.Reduce on the tape.
func (tp *Tape) Reduce(ctx context.Context, x *Var, op Op, root int) (*Var, error) {
	return tp.collective(ctx, "Reduce", x, reduceCall(value(x), op, root), func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error) {
		return tp.c.ReduceAdjoint(ctx, g, op, root)
	})
}
