package collective

import "context"

// Allreduce: every rank gets the reduction of every rank's tensor.

const kindAllreduce kind = 1

// publishReduce publishes an Allreduce's or a Reduce's input: all of a
// small Allreduce, which every rank reduces whole; otherwise all but this
// rank's own chunk, which only it reads, from its input.
func publishReduce(s *shmPub) error {
	d, in := s.d, s.in
	if !Supported(d.dtype) {
		return nil
	}
	buf, err := s.c.shm.publish(s.set, len(in))
	if err != nil {
		return err
	}
	if d.kind == kindAllreduce && len(in) <= smallShm {
		copy(buf, in) // every rank reduces all of it
		return nil
	}
	me, n := s.c.rank, s.c.size
	es := d.dtype.Size()
	ch := chunks(len(in)/max(es, 1), n)
	copy(buf[:ch[me]*es], in[:ch[me]*es])
	copy(buf[ch[me+1]*es:], in[ch[me+1]*es:])
	return nil
}

// shmReduce is Allreduce and Reduce through the shared mappings: each rank
// reduces its chunk from every mapping and publishes it, then copies the
// others' (Reduce: the root only). A small Allreduce is reduced whole by
// every rank.
func shmReduce(ctx context.Context, s *shmRun) error {
	g, p, in, out := s.g, s.p, s.in, s.out
	me, n, es := s.c.rank, s.c.size, p.esize
	if p.kind == kindAllreduce && p.bytes(me) <= smallShm {
		// Small: every rank reduces the whole tensor from every
		// mapping, in rank order (the same bits everywhere), which
		// saves the second wait.
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
	ch := chunks(numel(p.shapes[me]), n)
	lo, hi := ch[me]*es, ch[me+1]*es
	srcs, err := s.srcs()
	if err != nil {
		return err
	}
	for r := range srcs {
		srcs[r] = srcs[r][lo:hi]
	}
	mine, err := g.publish(s.set, p.bytes(me))
	if err != nil {
		return err
	}
	reduceN(p.op, p.dt, mine[lo:hi], srcs)
	g.setPhase(s.base + 2)
	if p.kind == kindReduce && me != p.root {
		clear(out)
		return nil
	}
	copy(out[lo:hi], mine[lo:hi])
	if err := g.waitAll(ctx, s.base+2); err != nil {
		return err
	}
	for r := range n {
		if r == me {
			continue
		}
		b, err := g.peerData(r, s.set, p.bytes(r))
		if err != nil {
			return err
		}
		copy(out[ch[r]*es:ch[r+1]*es], b[ch[r]*es:ch[r+1]*es])
	}
	return nil
}

// tcpAllreduce is recursive doubling for a small tensor, a ring
// reduce-scatter and allgather for a large one.
func tcpAllreduce(x *xfer, p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	if !sameMem(out, in) {
		copy(out, in)
	}
	if len(out) <= smallAllreduce || numel(p.shapes[me]) < n {
		return x.doubling(p, out)
	}
	blocks := scale(chunks(numel(p.shapes[me]), n), es)
	if err := x.ringReduceScatter(p, out, blocks); err != nil {
		return err
	}
	return x.ringAllgather(out, blocks)
}
