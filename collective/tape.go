package collective

import (
	"context"
	"fmt"
	"sync"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Automatic differentiation across ranks, with a tape.
//
// A Tape records, in program order, the collectives and point-to-point
// calls a rank makes on Vars, and the local computations between them
// (Func, with their adjoints as the caller writes them). Backward replays
// the adjoints in reverse order. Every rank that recorded the same
// communication in the same order therefore communicates in the same
// (reversed) order going back, and every recorded collective's adjoint runs
// on every rank whether or not a gradient reached it on that rank (a zero
// gradient stands in): no rank waits for a backward call another rank
// skipped, which is the deadlock mpi4torch's JoinDummies is there to
// prevent. JoinDummies is kept for code ported from mpi4torch.
//
// docs/collective.md says why a tape and not gorgonia's graph.

// Tape records operations for Backward. A Tape is safe for concurrent use,
// but the order of recording is the order of replay: record communication
// from one goroutine.
type Tape struct {
	c    *Comm
	mu   sync.Mutex
	ops  []tapeOp
	done bool
}

// Var is a tensor on a tape: a leaf (Tape.Leaf) or the result of a
// recorded operation.
type Var struct {
	tape *Tape
	t    *tensordict.Tensor
	grad *tensordict.Tensor
	leaf bool
	// borrowed: grad is not the tape's to write: the caller's seed, or
	// what a Func's adjoint returned. The tape never copies it; an
	// adjoint that would write its gradient in place (Allreduce's) writes
	// a new tensor instead, and a second gradient adds up into a new one.
	borrowed bool
}

// Value returns the tensor (nil for an output a rank does not get, such as
// Gather's off the root).
func (v *Var) Value() *tensordict.Tensor { return v.t }

// Grad returns the gradient Backward accumulated for a leaf (Tape.Leaf),
// or nil when none reached it. As in torch, the gradients of intermediate
// Vars are released once used: Grad of one is nil after Backward.
func (v *Var) Grad() *tensordict.Tensor { return v.grad }

// tapeOp is one recorded operation: the gradients of its outputs to the
// gradients of its inputs. owned[j] says whether gouts[j] is the tape's
// (back may write it in place) or borrowed (back must not write it).
type tapeOp struct {
	name string
	ins  []*Var
	outs []*Var
	back func(ctx context.Context, gouts []*tensordict.Tensor, owned []bool) ([]*tensordict.Tensor, error)
	// fresh: the gradients back returns are the tape's (a collective's
	// results, or gradients of its outputs that were the tape's).
	fresh bool
}

// leafGrad reports whether g is the gradient of a leaf among outs (kept
// after Backward).
func leafGrad(g *tensordict.Tensor, outs []*Var) bool {
	for _, o := range outs {
		if o.leaf && o.grad == g {
			return true
		}
	}
	return false
}

// aliases reports whether g is one of gs.
func aliases(g *tensordict.Tensor, gs []*tensordict.Tensor) bool {
	for _, h := range gs {
		if h == g {
			return true
		}
	}
	return false
}

// NewTape returns an empty tape whose collectives run on c.
func NewTape(c *Comm) *Tape { return &Tape{c: c} }

// Leaf returns t as a Var: an input the gradient is wanted of.
func (tp *Tape) Leaf(t *tensordict.Tensor) *Var { return &Var{tape: tp, t: t, leaf: true} }

func (tp *Tape) record(op tapeOp) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.ops = append(tp.ops, op)
}

func (tp *Tape) vars(ts ...*tensordict.Tensor) []*Var {
	vs := make([]*Var, len(ts))
	for i, t := range ts {
		vs[i] = &Var{tape: tp, t: t}
	}
	return vs
}

func value(v *Var) *tensordict.Tensor {
	if v == nil {
		return nil
	}
	return v.t
}

// Func records a local computation: outs computed from ins by the caller,
// and back, which maps the gradients of outs (zeros where none flowed; nil
// for a nil output) to the gradients of ins (nil for none).
func (tp *Tape) Func(name string, ins []*Var, outs []*tensordict.Tensor, back func(ctx context.Context, gouts []*tensordict.Tensor) ([]*tensordict.Tensor, error)) []*Var {
	vs := tp.vars(outs...)
	tp.record(tapeOp{name: name, ins: ins, outs: vs, back: func(ctx context.Context, g []*tensordict.Tensor, _ []bool) ([]*tensordict.Tensor, error) {
		return back(ctx, g)
	}})
	return vs
}

// collective records a one-in, one-out collective whose adjoint returns
// a new tensor.
func (tp *Tape) collective(ctx context.Context, name string, x *Var, cl *call, back func(ctx context.Context, p *plan, g *tensordict.Tensor) (*tensordict.Tensor, error)) (*Var, error) {
	return tp.collectiveOwned(ctx, name, x, cl, false, nil, func(ctx context.Context, p *plan, g *tensordict.Tensor, _ bool) (*tensordict.Tensor, error) {
		return back(ctx, p, g)
	})
}

// collectiveOwned records a one-in, one-out collective whose adjoint may
// write the gradient of its output in place when owned says it is the
// tape's, and returns either that or a new tensor.
// With into, the forward writes into dst (the Into form; a nil dst fails
// on every rank, as in the Comm's calls), which is the output's value.
func (tp *Tape) collectiveOwned(ctx context.Context, name string, x *Var, cl *call, into bool, dst *tensordict.Tensor, back func(ctx context.Context, p *plan, g *tensordict.Tensor, owned bool) (*tensordict.Tensor, error)) (*Var, error) {
	if into {
		withOut(cl, dst)
	}
	y, p, err := tp.c.run(ctx, cl)
	if err != nil {
		return nil, err
	}
	if into {
		y = dst
	}
	out := tp.vars(y)
	tp.record(tapeOp{name: name, ins: []*Var{x}, outs: out, fresh: true, back: func(ctx context.Context, g []*tensordict.Tensor, owned []bool) ([]*tensordict.Tensor, error) {
		gi, err := back(ctx, p, g[0], owned[0])
		return []*tensordict.Tensor{gi}, err
	}})
	return out[0], nil
}

// Send is Comm.Send on the tape; its adjoint receives x's gradient from
// dest.
func (tp *Tape) Send(ctx context.Context, x *Var, dest, tag int) error {
	if err := tp.c.Send(ctx, value(x), dest, tag); err != nil {
		return err
	}
	tp.record(tapeOp{name: "Send", ins: []*Var{x}, back: func(ctx context.Context, _ []*tensordict.Tensor, _ []bool) ([]*tensordict.Tensor, error) {
		g, err := tp.c.SendAdjoint(ctx, x.t, dest, tag)
		return []*tensordict.Tensor{g}, err
	}})
	return nil
}

// Recv is Comm.Recv on the tape, into buf; the returned Var is the
// received tensor (buf itself), whose gradient goes back to src. buf's own
// gradient is zero.
func (tp *Tape) Recv(ctx context.Context, buf *Var, src, tag int) (*Var, error) {
	if err := tp.c.Recv(ctx, value(buf), src, tag); err != nil {
		return nil, err
	}
	out := tp.vars(buf.t)
	tp.record(tapeOp{name: "Recv", ins: []*Var{buf}, outs: out, back: func(ctx context.Context, g []*tensordict.Tensor, _ []bool) ([]*tensordict.Tensor, error) {
		return []*tensordict.Tensor{nil}, tp.c.RecvAdjoint(ctx, g[0], src, tag)
	}})
	return out[0], nil
}

// TapeRequest is an Isend or Irecv on a tape.
type TapeRequest struct {
	tp *Tape
	r  *Request
	x  *Var // what is sent, or the receive buffer

	// the adjoint in flight between the replay of Wait and of the start
	back   *Request
	backed chan struct{}
}

// Isend is Comm.Isend on the tape. Going back, the adjoint of Wait starts
// receiving x's gradient and the adjoint of Isend waits for it, so
// adjoints of overlapping requests overlap too.
func (tp *Tape) Isend(ctx context.Context, x *Var, dest, tag int) *TapeRequest {
	return tp.start(ctx, x, tp.c.Isend(ctx, value(x), dest, tag))
}

// Irecv is Comm.Irecv on the tape, into buf; Wait returns the received
// Var.
func (tp *Tape) Irecv(ctx context.Context, buf *Var, src, tag int) *TapeRequest {
	return tp.start(ctx, buf, tp.c.Irecv(ctx, value(buf), src, tag))
}

func (tp *Tape) start(ctx context.Context, x *Var, r *Request) *TapeRequest {
	tr := &TapeRequest{tp: tp, r: r, x: x, backed: make(chan struct{})}
	tp.record(tapeOp{name: r.what(), ins: []*Var{x}, back: func(ctx context.Context, _ []*tensordict.Tensor, _ []bool) ([]*tensordict.Tensor, error) {
		select {
		case <-tr.backed:
		default:
			return nil, fmt.Errorf("collective: %s was never waited for", r.what())
		}
		if err := tr.back.Wait(ctx); err != nil {
			return nil, err
		}
		if r.send {
			return []*tensordict.Tensor{tr.back.t}, nil
		}
		return []*tensordict.Tensor{nil}, nil // the receive buffer's gradient is zero
	}})
	return tr
}

// Wait is Request.Wait on the tape. For an Irecv it returns the received
// tensor as a Var whose gradient goes back to the sender; for an Isend,
// nil.
func (tr *TapeRequest) Wait(ctx context.Context) (*Var, error) {
	if err := tr.r.Wait(ctx); err != nil {
		return nil, err
	}
	tp, r := tr.tp, tr.r
	var outs []*Var
	if !r.send {
		outs = tp.vars(tr.x.t)
	}
	tp.record(tapeOp{name: "Wait", outs: outs, back: func(ctx context.Context, g []*tensordict.Tensor, _ []bool) ([]*tensordict.Tensor, error) {
		if r.send {
			buf, err := tensordict.Zeros(tr.x.t.DType(), tr.x.t.Shape()...)
			if err != nil {
				return nil, err
			}
			tr.back = tp.c.Irecv(ctx, buf, r.peer, r.tag)
		} else {
			tr.back = tp.c.Isend(ctx, g[0], r.peer, r.tag)
		}
		close(tr.backed)
		return nil, nil
	}})
	if outs == nil {
		return nil, nil
	}
	return outs[0], nil
}

// JoinDummies returns x as a new Var that depends on dummies too, as
// mpi4torch's JoinDummies: going back, x's gradient passes through and the
// dummies get none. On a tape every recorded operation's adjoint runs in
// reverse order anyway, so it only marks the dependency.
func (tp *Tape) JoinDummies(x *Var, dummies ...*Var) *Var {
	out := tp.vars(x.t)
	tp.record(tapeOp{name: "JoinDummies", ins: append([]*Var{x}, dummies...), outs: out, back: func(ctx context.Context, g []*tensordict.Tensor, _ []bool) ([]*tensordict.Tensor, error) {
		gi := make([]*tensordict.Tensor, 1+len(dummies))
		gi[0] = g[0]
		return gi, nil
	}})
	return out[0]
}

// Backward sets the gradient of y to seed (ones of y's shape if nil) and
// replays every recorded adjoint in reverse order, accumulating each
// input's gradient (Var.Grad). Every rank calls it, as a collective. A
// tape replays once; a second Backward fails with ErrNoAdjoint.
func (tp *Tape) Backward(ctx context.Context, y *Var, seed *tensordict.Tensor) error {
	// The caller's seed is borrowed: never copied, never written.
	return tp.backward(ctx, y, seed, seed == nil)
}

// BackwardInPlace is Backward with seed handed to the tape, as
// the ones Backward makes when given none: the gradient of y, the tape's
// to write. Adjoints that work in place (Allreduce's) reduce it where it
// is, and it may become a leaf's gradient itself (Var.Grad returns seed
// then). A training loop that keeps one seed buffer from step to step
// thus allocates nothing for a backward pass of Allreduces, where Backward
// allocates each step a new tensor per gradient it must not write. The
// caller must not read or write seed until it is done with the gradients
// (its contents are then what the adjoints left in it). A nil seed is
// ones, as in Backward.
func (tp *Tape) BackwardInPlace(ctx context.Context, y *Var, seed *tensordict.Tensor) error {
	return tp.backward(ctx, y, seed, true)
}

// backward is Backward; owned says whether seed is the tape's to write
// (nil: ones the tape makes, which are).
func (tp *Tape) backward(ctx context.Context, y *Var, seed *tensordict.Tensor, owned bool) error {
	tp.mu.Lock()
	if tp.done {
		tp.mu.Unlock()
		return errorf(ErrNoAdjoint, "rank %d: the tape was replayed already", tp.c.rank)
	}
	tp.done = true
	ops := tp.ops
	tp.mu.Unlock()
	if y != nil && y.t != nil {
		if seed == nil {
			var err error
			if seed, err = ones(y.t); err != nil {
				return err
			}
		}
		if err := accumulate(y, seed, owned); err != nil {
			return err
		}
	}
	var leaves []*Var
	for i := len(ops) - 1; i >= 0; i-- {
		op := ops[i]
		gouts := make([]*tensordict.Tensor, len(op.outs))
		gowned := make([]bool, len(op.outs))
		for j, o := range op.outs {
			switch {
			case o.t == nil:
			case o.grad != nil:
				gouts[j], gowned[j] = o.grad, !o.borrowed && !o.leaf
			default:
				z, err := tensordict.Zeros(o.t.DType(), o.t.Shape()...)
				if err != nil {
					return err
				}
				gouts[j], gowned[j] = z, true
			}
		}
		gins, err := op.back(ctx, gouts, gowned)
		if err != nil {
			return fmt.Errorf("backward through %s (operation %d on the tape): %w", op.name, i, err)
		}
		// The outputs' gradients are complete and used: release those of
		// intermediate Vars, so that the tape may hand them on.
		for _, o := range op.outs {
			if !o.leaf {
				o.grad = nil
			}
		}
		for j, g := range gins {
			if g != nil && j < len(op.ins) && op.ins[j] != nil {
				// The tape owns a gradient that is new (a collective's
				// result) or that was an output's it owned (released
				// above), once; any other (a Func's, the caller's seed
				// passed on) it borrows: no copy either way.
				// A tensor handed to two inputs is borrowed by both, so
				// that neither writes the other's.
				owned := ownedGrad(g, op, gouts, gowned) && !aliases(g, gins[:j]) && !aliases(g, gins[j+1:]) && !leafGrad(g, op.outs)
				if err := accumulate(op.ins[j], g, owned); err != nil {
					return fmt.Errorf("backward through %s: %w", op.name, err)
				}
				if op.ins[j].leaf {
					leaves = append(leaves, op.ins[j])
				}
			}
		}
	}
	if y != nil && y.leaf {
		leaves = append(leaves, y)
	}
	for _, v := range leaves {
		if v.borrowed {
			// A leaf's Grad is the caller's to keep and change: not the
			// caller's seed, nor a tensor a Func's adjoint holds, handed
			// back. The one copy the tape makes, and only when no
			// operation between made a new gradient.
			c, err := v.grad.Clone()
			if err != nil {
				return err
			}
			v.grad, v.borrowed = c, false
		}
	}
	return nil
}

// ownedGrad reports whether g, an input gradient op's adjoint returned,
// is the tape's: new (an adjoint that returns new tensors), or an output
// gradient the tape owned.
func ownedGrad(g *tensordict.Tensor, op tapeOp, gouts []*tensordict.Tensor, gowned []bool) bool {
	for k, h := range gouts {
		if h == g {
			return gowned[k]
		}
	}
	return op.fresh
}

// ones returns a tensor of ones like t.
func ones(t *tensordict.Tensor) (*tensordict.Tensor, error) {
	o, err := tensordict.Zeros(t.DType(), t.Shape()...)
	if err != nil {
		return nil, err
	}
	b, _ := o.Bytes()
	switch t.DType() {
	case memmap.Float32:
		fill(as[float32](b), 1)
	case memmap.Float64:
		fill(as[float64](b), 1)
	default:
		es := t.DType().Size()
		for i := 0; i < len(b); i += es {
			t.DType().PutFloat64(b[i:], 1)
		}
	}
	return o, nil
}

func fill[T any](s []T, v T) {
	for i := range s {
		s[i] = v
	}
}

// accumulate adds g to v's gradient. With owned, g is the tape's to keep
// (a new tensor no one else holds) and may be written in place; else it
// is borrowed, and the gradient is g itself until a second one adds up
// (into a new tensor then).
func accumulate(v *Var, g *tensordict.Tensor, owned bool) error {
	if v.grad == nil {
		v.grad, v.borrowed = g, !owned
		return nil
	}
	if v.grad.DType() != g.DType() || v.grad.NumElements() != g.NumElements() {
		return argumentf("gradients %v and %v do not add up", v.grad, g)
	}
	if !Sum.Supports(g.DType()) {
		return argumentf("gradients of %v cannot be added", g.DType())
	}
	a, _ := v.grad.Bytes()
	b, err := g.Bytes()
	if err != nil {
		return err
	}
	if v.borrowed {
		// Not ours to write: the sum goes into a new tensor.
		sum, err := tensordict.Zeros(g.DType(), v.grad.Shape()...)
		if err != nil {
			return err
		}
		sb, _ := sum.Bytes()
		reduceN(Sum, g.DType(), sb, [][]byte{a, b})
		v.grad, v.borrowed = sum, false
		return nil
	}
	reduceN(Sum, g.DType(), a, [][]byte{a, b})
	return nil
}
