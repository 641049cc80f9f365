package collective

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/tensorwire/tensorwire/memmap"
)

// Collectives through shared mappings (shm_linux.go has the mechanism).
// Collective number seq uses file set seq&1 and moves every rank's phase
// from 3*seq to 3*seq+3:
//
//	3seq+1  published: the description and the data are in place
//	3seq+2  reduced: the rank's share of a reduction is in place
//	3seq+3  done: the rank no longer reads the others' files of this set

// smallShm is the size up to which every rank reduces a whole Allreduce
// itself: n times the reads, one wait fewer.
const smallShm = 64 << 10

// chunks returns the element offsets of an even split of n elements in k.
func chunks(n, k int) []int { return prefix(evenCounts(n, k)) }

// shmCollective runs cl through the shared mappings, under a fault guard:
// a file of the session truncated under its mapping (by hand, or by a rank
// gone wrong) fails the collective and breaks the communicator, as any
// error in a data phase does, instead of killing the process.
func (c *Comm) shmCollective(ctx context.Context, seq uint64, cl *call) (p *plan, out []byte, err error) {
	fault := memmap.Guard(func() error {
		p, out, err = c.shmSteps(ctx, seq, cl)
		return nil
	})
	if fault == nil {
		return p, out, err
	}
	err = fmt.Errorf("collective %d through the shared mappings: %w", seq, fault)
	// failData writes our control words (abort), which may be what
	// faulted: then the communicator is failed without them.
	cause := err
	if memmap.Guard(func() error { err = c.failData(ctx, cause); return nil }) != nil {
		c.fail(cause)
		err = cause
	}
	return nil, nil, err
}

// shmSteps is shmCollective's work.
func (c *Comm) shmSteps(ctx context.Context, seq uint64, cl *call) (*plan, []byte, error) {
	g := c.shm
	set := int(seq & 1)
	base := uint32(3 * seq)
	me, n := c.rank, c.size
	// The files of this set were last used by collective seq-2: wait for
	// every rank to be done with it.
	if seq >= 2 {
		if err := g.waitAll(ctx, base-3); err != nil {
			return nil, nil, c.failData(ctx, err)
		}
	}
	d := &cl.d
	enc := d.encode(nil)
	if len(enc) > ctlDescRoom {
		d.bad = "the call's description is too large (too many counts?)"
		d.counts = nil
		enc = d.encode(nil)
	}
	g.putDesc(set, enc)
	if err := c.shmPublish(set, cl); err != nil {
		// Still take part, so the others learn of it.
		d.bad = fmt.Sprintf("publishing the tensor: %v", err)
		d.noSpace = errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
		g.putDesc(set, d.encode(nil))
	}
	g.setPhase(base + 1)
	if err := g.waitAll(ctx, base+1); err != nil {
		return nil, nil, c.failData(ctx, err)
	}
	ds := make([]desc, n)
	for r := range n {
		var err error
		if ds[r], err = g.desc(r, set); err != nil {
			g.setPhase(base + 3)
			return nil, nil, c.failData(ctx, fmt.Errorf("rank %d's description: %w", r, err))
		}
	}
	p, err := check(ds)
	if err != nil {
		g.setPhase(base + 3)
		return nil, nil, err
	}
	out := cl.output(p, me)
	if err := c.shmData(ctx, g, set, base, p, cl.in, out); err != nil {
		return nil, nil, c.failData(ctx, err)
	}
	g.setPhase(base + 3)
	return p, out, nil
}

// shmPublish copies what others will read of this rank's input into its
// data file.
func (c *Comm) shmPublish(set int, cl *call) error {
	d, in := &cl.d, cl.in
	if d.bad != "" || !d.hasT {
		return nil
	}
	me, n := c.rank, c.size
	switch d.kind {
	case kindAllreduce, kindReduce:
		if !Supported(d.dtype) {
			return nil
		}
		buf, err := c.shm.publish(set, len(in))
		if err != nil {
			return err
		}
		if d.kind == kindAllreduce && len(in) <= smallShm {
			copy(buf, in) // every rank reduces all of it
			return nil
		}
		// All but our own chunk, which only we read, from in.
		es := d.dtype.Size()
		ch := chunks(len(in)/max(es, 1), n)
		copy(buf[:ch[me]*es], in[:ch[me]*es])
		copy(buf[ch[me+1]*es:], in[ch[me+1]*es:])
	case kindBcast, kindScatter:
		if me != d.root {
			return nil
		}
		fallthrough
	case kindGather:
		if d.kind == kindGather && me == d.root {
			return nil
		}
		fallthrough
	case kindAllgather, kindAlltoall, kindReduceScatter:
		buf, err := c.shm.publish(set, len(in))
		if err != nil {
			return err
		}
		copy(buf, in)
	}
	return nil
}

// shmData moves the data of plan p.
func (c *Comm) shmData(ctx context.Context, g *shmGroup, set int, base uint32, p *plan, in, out []byte) error {
	me, n, es := c.rank, c.size, p.esize
	// src returns rank r's input as this rank sees it.
	src := func(r int) ([]byte, error) {
		if r == me {
			return in, nil
		}
		return g.peerData(r, set, p.bytes(r))
	}
	switch p.kind {
	case kindBarrier:
	case kindAllreduce, kindReduce:
		if p.kind == kindAllreduce && p.bytes(me) <= smallShm {
			// Small: every rank reduces the whole tensor from every
			// mapping, in rank order (the same bits everywhere), which
			// saves the second wait.
			srcs := make([][]byte, n)
			for r := range n {
				b, err := src(r)
				if err != nil {
					return err
				}
				srcs[r] = b
			}
			if sameMem(out, in) {
				srcs[me], _ = g.peerData(me, set, p.bytes(me)) // our published copy
			}
			reduceN(p.op, p.dt, out, srcs)
			return nil
		}
		ch := chunks(numel(p.shapes[me]), n)
		lo, hi := ch[me]*es, ch[me+1]*es
		srcs := make([][]byte, n)
		for r := range n {
			b, err := src(r)
			if err != nil {
				return err
			}
			srcs[r] = b[lo:hi]
		}
		mine, err := g.publish(set, p.bytes(me))
		if err != nil {
			return err
		}
		reduceN(p.op, p.dt, mine[lo:hi], srcs)
		g.setPhase(base + 2)
		if p.kind == kindReduce && me != p.root {
			clear(out)
			return nil
		}
		copy(out[lo:hi], mine[lo:hi])
		if err := g.waitAll(ctx, base+2); err != nil {
			return err
		}
		for r := range n {
			if r == me {
				continue
			}
			b, err := g.peerData(r, set, p.bytes(r))
			if err != nil {
				return err
			}
			copy(out[ch[r]*es:ch[r+1]*es], b[ch[r]*es:ch[r+1]*es])
		}
	case kindReduceScatter:
		shape := p.shapes[me]
		box := p.outShape(me)
		off := at(len(shape), p.axis, prefix(p.counts)[me])
		bufs := make([][]byte, n)
		for r := range n {
			b, err := src(r)
			if err != nil {
				return err
			}
			bufs[r] = b
		}
		srcs := make([][]byte, n)
		boxRuns([][]int{box, shape}, [][]int{zeros(len(box)), off}, box, es, func(a []int, k int) {
			for r := range n {
				srcs[r] = bufs[r][a[1] : a[1]+k]
			}
			reduceN(p.op, p.dt, out[a[0]:a[0]+k], srcs)
		})
	case kindBcast:
		b, err := src(p.root)
		if err != nil {
			return err
		}
		if !sameMem(out, b) {
			copy(out, b)
		}
	case kindGather, kindAllgather:
		if out == nil {
			return nil
		}
		oshape := p.outShape(me)
		pre := prefix(p.sizes)
		for r := range n {
			b, err := src(r)
			if err != nil {
				return err
			}
			boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), b, p.shapes[r], zeros(len(oshape)), p.shapes[r], es)
		}
	case kindScatter:
		b, err := src(p.root)
		if err != nil {
			return err
		}
		oshape := p.outShape(me)
		boxCopy(out, oshape, zeros(len(oshape)), b, p.shapes[p.root], at(len(oshape), p.axis, prefix(p.counts)[me]), oshape, es)
	case kindAlltoall:
		oshape := p.outShape(me)
		pre, cpre := prefix(p.sizes), prefix(p.counts)
		for r := range n {
			b, err := src(r)
			if err != nil {
				return err
			}
			box := along(p.shapes[r], p.axis2, p.counts[me])
			boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), b, p.shapes[r], at(len(oshape), p.axis2, cpre[me]), box, es)
		}
	}
	return nil
}

// sameMem reports whether a and b start at the same byte.
func sameMem(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}
