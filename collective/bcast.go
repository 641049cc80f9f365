package collective

import (
	"context"
	"math/bits"
	"sync"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Bcast: every rank gets the root's tensor.

const kindBcast kind = 2

func bcastShape(p *plan, _ int) []int { return p.shapes[p.root] }

// shmBcast copies the root's mapping.
func shmBcast(_ context.Context, s *shmRun) error {
	b, err := s.src(s.p.root)
	if err != nil {
		return err
	}
	if !sameMem(s.out, b) {
		copy(s.out, b)
	}
	return nil
}

func bcastCall(t *tensordict.Tensor, root, me int) *call {
	d, in := describe(kindBcast, t)
	d.root = root
	if me != root {
		in = nil
	}
	return &call{d: d, in: in}
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
	return c.runInto(ctx, bcastCall(t, root, c.rank), t)
}

// BcastAdjoint is the adjoint of Bcast(root): Reduce(Sum, root) of the
// gradient; the root gets the sum, the other ranks zeros (their input did
// not count).
func (c *Comm) BcastAdjoint(ctx context.Context, grad *tensordict.Tensor, root int) (*tensordict.Tensor, error) {
	return c.Reduce(ctx, grad, Sum, root)
}

// Bcast is Comm.Bcast on the tape.
func (tp *Tape) Bcast(ctx context.Context, x *Var, root int) (*Var, error) {
	return tp.collective(ctx, "Bcast", x, bcastCall(value(x), root, tp.c.rank), func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error) {
		gi, err := tp.c.BcastAdjoint(ctx, g, root)
		if tp.c.rank != root && value(x) == nil {
			gi = nil
		}
		return gi, err
	})
}

// bcast sends the root's tensor down a binomial tree.
func (x *xfer) bcast(p *plan, in, out []byte) error {
	me, n := x.c.rank, x.c.size
	if me == p.root && !sameMem(out, in) {
		copy(out, in)
	}
	ranks := make([]int, n)
	for r := range ranks {
		ranks[r] = r
	}
	return x.tree(ranks, me, p.root, out, nil)
}

// tree sends buf from ranks[root] down a binomial tree of ranks, of
// which this rank is ranks[me] (message step 0, from each sender): the
// root sends its buf, every other rank receives into its buf and passes
// it on. got, when not nil, runs once buf has arrived, beside the sends
// down the tree (the hierarchy shares buf with the host's ranks then).
func (x *xfer) tree(ranks []int, me, root int, buf []byte, got func() error) error {
	n := len(ranks)
	vr := (me - root + n) % n
	mask := 1
	for mask < n {
		if vr&mask != 0 {
			from := ranks[(vr-mask+root)%n]
			if err := x.exchangeAt(0, -1, nil, from, len(buf), into(buf)); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	mask >>= 1
	var wg sync.WaitGroup
	errs := make(chan error, bits.Len(uint(n))+2)
	for ; mask > 0; mask >>= 1 {
		if vr+mask < n {
			to := ranks[(vr+mask+root)%n]
			wg.Go(func() { errs <- x.c.sendBytes(x.ctx, to, x.key(x.c.rank, 0), buf) })
		}
	}
	if got != nil {
		errs <- got()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
