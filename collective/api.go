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

// Each collective's calls (on Comm and on a Tape) and its adjoint are in
// its own file, with its data phases (ops.go lists them).

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

// runInto runs cl writing this rank's result into dst (the Into calls).
func (c *Comm) runInto(ctx context.Context, cl *call, dst *tensordict.Tensor) error {
	withOut(cl, dst)
	_, _, err := c.run(ctx, cl)
	return err
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
