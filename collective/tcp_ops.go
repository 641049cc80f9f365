package collective

import (
	"context"
	"math/bits"
	"sync"
)

// Collectives over the ranks' rpc connections. The descriptions go to
// every rank directly; the data moves by the algorithms MPICH and gloo
// choose: for Allreduce, recursive doubling for small tensors (log2 n
// rounds, latency-optimal) and a ring for large ones (a reduce-scatter and
// an allgather, each n-1 steps of 1/n of the tensor: bandwidth-optimal);
// a ring for ReduceScatter and Allgather; a binomial tree for Bcast;
// direct sends for Gather, Scatter and Alltoall.

// smallAllreduce is the size up to which Allreduce uses recursive
// doubling.
const smallAllreduce = 64 << 10

func (c *Comm) tcpCollective(ctx context.Context, seq uint64, cl *call) (*plan, []byte, error) {
	me, n := c.rank, c.size
	d := &cl.d
	enc := d.encode(nil)
	ds := make([]desc, n)
	ds[me] = *d
	// Post the others' descriptions, then send ours to each.
	waits := make([]func(context.Context) error, n)
	for r := range n {
		if r == me {
			continue
		}
		k := msgKey{src: r, space: spaceDesc, seq: seq}
		waits[r] = c.postBytes(r, k, -1, func(_ int, b []byte) error {
			var err error
			ds[r], err = decodeDesc(b)
			return err
		})
	}
	errs := make(chan error, n)
	for r := range n {
		if r != me {
			go func() { errs <- c.send(ctx, r, msgKey{src: me, space: spaceDesc, seq: seq}, enc) }()
		}
	}
	var first error
	for r := range n {
		if r == me {
			continue
		}
		if err := waits[r](ctx); err != nil && first == nil {
			first = err
		}
	}
	for r := 0; r < n-1; r++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, nil, c.failData(ctx, first)
	}
	p, err := check(ds)
	if err != nil {
		return nil, nil, err
	}
	out := cl.output(p, me)
	x := &xfer{c: c, ctx: ctx, seq: seq}
	if err := x.run(p, cl.in, out); err != nil {
		return nil, nil, c.failData(ctx, err)
	}
	return p, out, nil
}

// xfer is the data phase of one collective over TCP.
type xfer struct {
	c    *Comm
	ctx  context.Context
	seq  uint64
	step uint32
}

func (x *xfer) key(src int, step uint32) msgKey {
	return msgKey{src: src, space: spaceData, seq: x.seq, step: step}
}

// exchange, in one step, sends sb to rank to (unless to < 0) and receives
// n bytes from rank from (unless from < 0), handing them to consume.
func (x *xfer) exchange(to int, sb []byte, from, n int, consume func(off int, b []byte) error) error {
	step := x.step
	x.step++
	var wait func(context.Context) error
	if from >= 0 {
		wait = x.c.postBytes(from, x.key(from, step), n, consume)
	}
	var serr error
	var wg sync.WaitGroup
	if to >= 0 {
		wg.Go(func() { serr = x.c.sendBytes(x.ctx, to, x.key(x.c.rank, step), sb) })
	}
	var rerr error
	if wait != nil {
		rerr = wait(x.ctx)
	}
	wg.Wait()
	if serr != nil {
		return serr
	}
	return rerr
}

// into returns a consumer that copies into dst.
func into(dst []byte) func(off int, b []byte) error {
	return func(off int, b []byte) error {
		copy(dst[off:], b)
		return nil
	}
}

// run moves the data of plan p, as the collective's tcp says.
func (x *xfer) run(p *plan, in, out []byte) error {
	return p.o.tcp(x, p, in, out)
}

// tcpNothing moves no data (Barrier).
func tcpNothing(*xfer, *plan, []byte, []byte) error { return nil }

// scale returns offs times es.
func scale(offs []int, es int) []int {
	s := make([]int, len(offs))
	for i, o := range offs {
		s[i] = o * es
	}
	return s
}

// ringReduceScatter reduces the blocks of acc (block r is
// acc[blocks[r]:blocks[r+1]]) around the ring, so that rank r ends with
// the reduction of block r over every rank in its acc.
func (x *xfer) ringReduceScatter(p *plan, acc []byte, blocks []int) error {
	me, n := x.c.rank, x.c.size
	right, left := (me+1)%n, (me-1+n)%n
	blk := func(i int) []byte {
		i = ((i % n) + n) % n
		return acc[blocks[i]:blocks[i+1]]
	}
	for s := 0; s < n-1; s++ {
		sb, rb := blk(me-s-1), blk(me-s-2)
		err := x.exchange(right, sb, left, len(rb), func(off int, b []byte) error {
			dst := rb[off : off+len(b)]
			reduceN(p.op, p.dt, dst, [][]byte{b, dst})
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// ringAllgather passes the blocks of buf around the ring, starting with
// each rank's own, until every rank has all.
func (x *xfer) ringAllgather(buf []byte, blocks []int) error {
	me, n := x.c.rank, x.c.size
	right, left := (me+1)%n, (me-1+n)%n
	blk := func(i int) []byte {
		i = ((i % n) + n) % n
		return buf[blocks[i]:blocks[i+1]]
	}
	for s := 0; s < n-1; s++ {
		sb, rb := blk(me-s), blk(me-s-1)
		if err := x.exchange(right, sb, left, len(rb), into(rb)); err != nil {
			return err
		}
	}
	return nil
}

// gatherBlocks sends this rank's block of buf to root, which puts every
// block in place in out; out of the root is zeroed.
func (x *xfer) gatherBlocks(root int, buf []byte, blocks []int, out []byte) error {
	me, n := x.c.rank, x.c.size
	if me != root {
		err := x.exchange(root, buf[blocks[me]:blocks[me+1]], -1, 0, nil)
		clear(out)
		return err
	}
	copy(out[blocks[me]:blocks[me+1]], buf[blocks[me]:blocks[me+1]])
	step := x.step
	x.step++
	waits := make([]func(context.Context) error, 0, n)
	for r := range n {
		if r != me {
			waits = append(waits, x.c.postBytes(r, x.key(r, step), blocks[r+1]-blocks[r], into(out[blocks[r]:blocks[r+1]])))
		}
	}
	var first error
	for _, w := range waits {
		if err := w(x.ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
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

// bcast sends the root's tensor down a binomial tree.
func (x *xfer) bcast(p *plan, in, out []byte) error {
	me, n := x.c.rank, x.c.size
	vr := (me - p.root + n) % n
	if me == p.root && !sameMem(out, in) {
		copy(out, in)
	}
	mask := 1
	for mask < n {
		if vr&mask != 0 {
			from := (vr - mask + p.root) % n
			if err := x.exchangeAt(0, -1, nil, from, len(out), into(out)); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	mask >>= 1
	var wg sync.WaitGroup
	errs := make(chan error, bits.Len(uint(n))+1)
	for ; mask > 0; mask >>= 1 {
		if vr+mask < n {
			to := (vr + mask + p.root) % n
			wg.Go(func() { errs <- x.c.sendBytes(x.ctx, to, x.key(me, 0), out) })
		}
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

// exchangeAt is exchange at a given step, leaving the step counter alone.
func (x *xfer) exchangeAt(step uint32, to int, sb []byte, from, n int, consume func(off int, b []byte) error) error {
	saved := x.step
	x.step = step
	err := x.exchange(to, sb, from, n, consume)
	x.step = saved
	return err
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
