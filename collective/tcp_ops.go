package collective

import (
	"context"
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

// exchangeAt is exchange at a given step, leaving the step counter alone.
func (x *xfer) exchangeAt(step uint32, to int, sb []byte, from, n int, consume func(off int, b []byte) error) error {
	saved := x.step
	x.step = step
	err := x.exchange(to, sb, from, n, consume)
	x.step = saved
	return err
}
