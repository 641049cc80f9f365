package collective

import (
	"context"
	"sync"

	"github.com/tensorwire/tensorwire/rpc"
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
	me := c.rank
	ds, first := c.exchangeDescs(ctx, seq, &cl.d)
	if first != nil {
		return nil, nil, c.failData(ctx, first)
	}
	p, err := check(ds)
	if err != nil {
		return nil, nil, err
	}
	out := cl.output(p, me)
	// The data goes uncompressed: tensors of floats rarely shrink by more
	// than a tenth under lz4, and lz4 runs at a fraction of the speed of
	// the links collectives run over (on loopback its sample and
	// compression took a fifth of a 1 MiB Allreduce's CPU time).
	x := &xfer{c: c, ctx: rpc.Uncompressed(ctx), seq: seq}
	// The caller's tensors may be mappings: a fault on one (its file
	// truncated) fails the collective on every rank, not the process
	// (the messages' consumers run under the same guard: mailbox.handle).
	if err := guardOwn(func() error { return x.run(p, cl.in, out) }); err != nil {
		return nil, nil, c.failData(ctx, err)
	}
	return p, out, nil
}

// exchangeDescs sends this rank's description d of collective seq to every
// other rank over TCP (message space 1) and returns every rank's, with the
// first error of a send or a receive. tcpCollective and the hierarchy both
// check a call this way, so a mismatch between ranks on different paths
// fails alike everywhere.
func (c *Comm) exchangeDescs(ctx context.Context, seq uint64, d *desc) ([]desc, error) {
	me, n := c.rank, c.size
	enc := d.seal() // d as the others decode it
	ds := make([]desc, n)
	ds[me] = *d
	waits := make([]func(context.Context) error, n)
	for r := range n {
		if r == me {
			continue
		}
		waits[r] = c.postBytes(r, msgKey{src: r, space: spaceDesc, seq: seq}, -1, func(_ int, b []byte) error {
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
	return ds, first
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

// exchange, as the next step, sends sb to rank to (unless to < 0) and
// receives n bytes from rank from (unless from < 0), handing them to
// consume.
func (x *xfer) exchange(to int, sb []byte, from, n int, consume func(off int, b []byte) error) error {
	step := x.step
	x.step++
	return x.exchangeAt(step, to, sb, from, n, consume)
}

// exchangeAt is exchange at a given step, leaving the step counter alone,
// so that several may run at once (the hierarchy's direct exchange). The
// buffers may be mappings: a fault on one, in the handler that consumes a
// message or in a send (sendMsg), is this rank's own error (guardOwn). A
// send that fails (the receiver broke) ends the wait for the receive too:
// that message may never come.
func (x *xfer) exchangeAt(step uint32, to int, sb []byte, from, n int, consume func(off int, b []byte) error) error {
	var wait func(context.Context) error
	if from >= 0 {
		wait = x.c.postBytes(from, x.key(from, step), n, func(off int, b []byte) error {
			return guardOwn(func() error { return consume(off, b) })
		})
	}
	rctx, cancel := context.WithCancel(x.ctx)
	defer cancel()
	var serr error
	var wg sync.WaitGroup
	if to >= 0 {
		wg.Go(func() {
			serr = x.c.sendBytes(x.ctx, to, x.key(x.c.rank, step), sb)
			if serr != nil {
				cancel()
			}
		})
	}
	var rerr error
	if wait != nil {
		rerr = wait(rctx)
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
	return x.ring(p, acc, acc, blocks, true, false)
}

// ringAllgather passes the blocks of buf around the ring, starting with
// each rank's own, until every rank has all.
func (x *xfer) ringAllgather(buf []byte, blocks []int) error {
	return x.ring(nil, buf, buf, blocks, false, true)
}

// ringInflight is how many pieces a rank has on the wire to its right
// neighbour at once: fewer than the side connections an rpc client opens
// to one node (8), so that every piece travels on a side connection of
// its own, from the tensor to the socket, and none through the session.
const ringInflight = 4

// ringPiece returns the size of the pieces a ring message of n bytes is
// cut into: pieceBytes, as every message. Smaller pieces would pipeline a
// 1 MiB Allreduce, but each message costs tens of microseconds of CPU
// (measured: 64 KiB pieces took 2.7 times the CPU of 1 MiB pieces for a
// 4-rank 1 MiB Allreduce), which a machine whose cores are all busy pays
// in time.
func ringPiece(int) int { return pieceBytes }

// ring moves blocks around the ring, piece by piece and pipelined: with
// rs, n-1 reduce-scatter steps (rank r ends with block r reduced over
// every rank in acc: each received piece is reduced with this rank's own
// piece of src into acc, so src may be another buffer than acc, and acc
// need not hold the input); with ag, then n-1 allgather steps (every rank
// ends with every block in acc). The piece of one step is sent as soon as
// the same piece of the step before has arrived (and been reduced), so
// the steps overlap: a piece does not wait for the rest of its block.
// Every block is reduced in the same order on its way round (the piece
// arriving first, then the rank's own), so every rank gets the same bits.
func (x *xfer) ring(p *plan, src, acc []byte, blocks []int, rs, ag bool) error {
	me, n := x.c.rank, x.c.size
	if n == 1 {
		if !sameMem(acc, src) {
			copy(acc, src)
		}
		return nil
	}
	right, left := (me+1)%n, (me-1+n)%n
	blk := func(b []byte, i int) []byte {
		i = ((i % n) + n) % n
		return b[blocks[i]:blocks[i+1]]
	}
	type step struct {
		send, recv, own []byte // own: this rank's part of recv (rs steps)
	}
	var steps []step
	if rs {
		for s := 0; s < n-1; s++ {
			from := acc
			if s == 0 {
				from = src // block me-1 of acc is not written before the allgather
			}
			steps = append(steps, step{send: blk(from, me-s-1), recv: blk(acc, me-s-2), own: blk(src, me-s-2)})
		}
	} else if !sameMem(acc, src) {
		copy(blk(acc, me), blk(src, me))
	}
	if ag {
		for s := 0; s < n-1; s++ {
			steps = append(steps, step{send: blk(acc, me-s), recv: blk(acc, me-s-1)})
		}
	}
	first := x.step
	x.step += uint32(len(steps))
	ctx, cancel := context.WithCancelCause(x.ctx)
	defer cancel(nil)

	// Post every piece of every step first: the left neighbour may run
	// ahead.
	type posted struct {
		k msgKey
		s *slot
	}
	recvs := make([][]posted, len(steps))
	for i, st := range steps {
		piece := ringPiece(len(st.recv))
		np := max(1, (len(st.recv)+piece-1)/piece)
		recvs[i] = make([]posted, np)
		for j := range np {
			lo, hi := j*piece, min(len(st.recv), (j+1)*piece)
			dst := st.recv[lo:hi]
			var own []byte
			if st.own != nil {
				own = st.own[lo:hi]
			}
			k := x.key(left, first+uint32(i))
			k.piece = uint32(j)
			recvs[i][j] = posted{k, x.c.box.post(k, func(b []byte) error {
				if len(b) != len(dst) {
					return ownErr(errorf(ErrMismatch, "rank %d sent %d bytes, rank %d expected %d", left, len(b), me, len(dst)))
				}
				if own != nil {
					reduceN(p.op, p.dt, dst, [][]byte{b, own})
				} else {
					copy(dst, b)
				}
				return nil
			})}
		}
	}

	fe := &firstError{cancel: cancel}
	sem := make(chan struct{}, ringInflight)
	var wg sync.WaitGroup
send:
	for i, st := range steps {
		piece := ringPiece(len(st.send))
		np := max(1, (len(st.send)+piece-1)/piece)
		for j := range np {
			if i > 0 {
				// The piece this one is (or is reduced into) must have
				// arrived.
				r := recvs[i-1][j]
				if err := x.c.box.wait(ctx, r.k, r.s); err != nil {
					fe.set(err)
					break send
				}
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				fe.set(ctx.Err())
				break send
			}
			k := x.key(me, first+uint32(i))
			k.piece = uint32(j)
			b := st.send[j*piece : min(len(st.send), (j+1)*piece)]
			wg.Go(func() {
				defer func() { <-sem }()
				if err := x.c.send(ctx, right, k, b); err != nil {
					fe.set(err)
				}
			})
		}
	}
	wg.Wait()
	// Every posted piece consumed (or, after an error, given up on: no
	// handler writes into acc after this).
	for _, rs := range recvs {
		for _, r := range rs {
			if err := x.c.box.wait(ctx, r.k, r.s); err != nil {
				fe.set(err)
			}
		}
	}
	return fe.get() // the first: the ones our cancel caused came after it
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
