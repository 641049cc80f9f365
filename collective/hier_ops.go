package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
)

// Collectives of a hierarchical communicator. Allreduce goes by levels:
//
//  1. within each host, through its shared mappings: every rank publishes
//     its input (all but its own 1/L share, L the host's ranks) and reduces
//     its share from the host's L mappings into its data file;
//  2. between hosts, over TCP: when every host has L ranks and the tensor
//     is over 64 KiB, every rank allreduces its share with the ranks at
//     its index on the other hosts (L exchanges between hosts at once,
//     each of 1/L of the tensor); otherwise each host's leader collects
//     the host's reduced shares into its data file and allreduces the
//     whole with the other leaders. Between H ranks: one direct exchange
//     up to 64 KiB (or fewer elements than H), a ring above;
//  3. within each host: every rank copies the others' shares (or the
//     leader's whole result).
//
// Bcast and Allgather go by levels too (hier_move.go), Reduce and
// ReduceScatter (hier_reduce.go), Gather and Scatter (hier_gather.go) and
// Alltoall (hier_alltoall.go). Barrier goes over TCP between every pair of
// ranks, as in a communicator that is TCP throughout (tcpCollective). Every collective's
// descriptions go the TCP way, from every rank to every other, so a rank
// that calls Allreduce and one that calls something else reach the same
// check, and the same error.

// hierSmall is the size up to which an Allreduce goes between hosts
// through the leaders, by one direct exchange (latency: one round trip);
// above it, share by share, by a ring.
const hierSmall = 64 << 10

// hierCollective runs cl in a hierarchical communicator.
func (c *Comm) hierCollective(ctx context.Context, seq uint64, cl *call) (*plan, []byte, error) {
	if !hierMoves(cl.d.kind) {
		return c.tcpCollective(ctx, seq, cl)
	}
	h := c.hier
	d := &cl.d
	if h.g != nil && d.bad == "" && d.hasT && Supported(d.dtype) {
		// Reserve the room this rank publishes in now, so that a full
		// folder is an error every rank reaches in the check
		// (ErrNoSpace), not a failure part-way. Growing the file
		// does not touch what the others may still read of it.
		if _, err := h.g.publish(int(h.k.Load()&1), h.hierReserve(c, d, cl.in)); err != nil {
			d.bad = fmt.Sprintf("publishing the tensor: %v", err)
			d.noSpace = errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
		}
	}
	ds, err := c.exchangeDescs(ctx, seq, d)
	if err != nil {
		return nil, nil, c.failData(ctx, err)
	}
	p, err := check(ds)
	if err != nil {
		return nil, nil, err
	}
	out := cl.output(p, c.rank)
	k := h.k.Load()
	// The data goes uncompressed between hosts, as on TCP (tcpCollective).
	dctx := rpc.Uncompressed(ctx)
	run, ok := hierRuns[p.kind]
	if !ok {
		run = (*hierState).allreduce
	}
	derr := guardOwn(func() error { return run(h, dctx, c, seq, k, p, cl.in, out) })
	h.k.Store(k + 1)
	if derr != nil {
		// failData writes our control words (abort), which may be what
		// faulted: then the communicator is failed without them.
		cause := derr
		if memmap.Guard(func() error { derr = c.failData(ctx, cause); return nil }) != nil {
			c.fail(cause)
			derr = cause
		}
		return nil, nil, derr
	}
	return p, out, nil
}

// allreduce is the data phase of Allreduce number k through the host's
// mappings (file set k&1, phases 3k+1 to 3k+3 of the host's group), seq
// the communicator's.
func (h *hierState) allreduce(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	g := h.g
	if g == nil {
		// Alone on its host: the leader, with nothing to collect.
		if !sameMem(out, in) {
			copy(out, in)
		}
		return between(ctx, c, seq, p, h.leaders, h.host, out)
	}
	set, base := int(k&1), uint32(3*k)
	L, li, es := len(h.ranks), h.local, p.esize
	size := len(in)
	if k >= 2 {
		if err := g.waitAll(ctx, base-3); err != nil {
			return err
		}
	}
	mine, err := g.publish(set, size)
	if err != nil {
		return err
	}
	ch := scale(chunks(size/max(es, 1), L), es)
	lo, hi := ch[li], ch[li+1]
	copy(mine[:lo], in[:lo])
	copy(mine[hi:], in[hi:])
	g.setPhase(base + 1)
	if err := g.waitAll(ctx, base+1); err != nil {
		return err
	}
	srcs := make([][]byte, L)
	for j := range L {
		if j == li {
			srcs[j] = in[lo:hi]
			continue
		}
		b, err := g.peerData(j, set, size)
		if err != nil {
			return err
		}
		srcs[j] = b[lo:hi]
	}
	reduceN(p.op, p.dt, mine[lo:hi], srcs)
	if h.peers != nil && size > hierSmall {
		// Every rank its share, with its peers on the other hosts.
		if err := between(ctx, c, seq, p, h.peers, h.host, mine[lo:hi]); err != nil {
			return err
		}
		g.setPhase(base + 2)
		copy(out[lo:hi], mine[lo:hi])
		if err := g.waitAll(ctx, base+2); err != nil {
			return err
		}
		for j := range L {
			if j == li {
				continue
			}
			b, err := g.peerData(j, set, size)
			if err != nil {
				return err
			}
			copy(out[ch[j]:ch[j+1]], b[ch[j]:ch[j+1]])
		}
		g.setPhase(base + 3)
		return nil
	}
	g.setPhase(base + 2)
	if li != 0 {
		// The leader's data file holds the result once it is done.
		if err := g.waitRank(ctx, 0, base+3); err != nil {
			return err
		}
		b, err := g.peerData(0, set, size)
		if err != nil {
			return err
		}
		copy(out, b)
		g.setPhase(base + 3)
		return nil
	}
	if err := g.waitAll(ctx, base+2); err != nil {
		return err
	}
	for j := 1; j < L; j++ {
		b, err := g.peerData(j, set, size)
		if err != nil {
			return err
		}
		copy(mine[ch[j]:ch[j+1]], b[ch[j]:ch[j+1]])
	}
	if err := between(ctx, c, seq, p, h.leaders, h.host, mine); err != nil {
		return err
	}
	copy(out, mine)
	g.setPhase(base + 3)
	return nil
}

// between allreduces buf, this host's reduction (of the whole tensor or of
// a share), with ranks, one per host by host index, of which this rank is
// ranks[me]: up to 64 KiB (or fewer elements than hosts) every one sends
// its whole buf to every other and reduces all in host order; above, a
// ring (a reduce-scatter then an allgather, 2(H-1) steps of 1/H of buf).
// Either way all of them end with the same bits.
func between(ctx context.Context, c *Comm, seq uint64, p *plan, ranks []int, me int, buf []byte) error {
	H := len(ranks)
	if H < 2 {
		return nil
	}
	x := &xfer{c: c, ctx: ctx, seq: seq}
	es := p.esize
	if len(buf) <= hierSmall || len(buf)/max(es, 1) < H {
		bufs := make([][]byte, H)
		bufs[me] = append([]byte(nil), buf...)
		var wg sync.WaitGroup
		errs := make([]error, H)
		for o := range H {
			if o == me {
				continue
			}
			bufs[o] = make([]byte, len(buf))
			wg.Go(func() { errs[o] = x.exchangeAt(0, ranks[o], bufs[me], ranks[o], len(buf), into(bufs[o])) })
		}
		wg.Wait()
		if err := firstErr(errs); err != nil {
			return err
		}
		reduceN(p.op, p.dt, buf, bufs)
		return nil
	}
	blocks := scale(chunks(len(buf)/es, H), es)
	blk := func(i int) []byte {
		i = ((i % H) + H) % H
		return buf[blocks[i]:blocks[i+1]]
	}
	right, left := ranks[(me+1)%H], ranks[(me-1+H)%H]
	for s := 0; s < H-1; s++ {
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
	for s := 0; s < H-1; s++ {
		sb, rb := blk(me-s), blk(me-s-1)
		if err := x.exchange(right, sb, left, len(rb), into(rb)); err != nil {
			return err
		}
	}
	return nil
}

// firstErr returns the first non-nil error of errs.
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// settle ends a step whose own part, run on the calling goroutine and
// ending with err, ran beside exchanges in goroutines of wg that end with
// errs: err cancels them (cancel), and is the step's error over theirs,
// which that cancellation may have caused. It returns once wg is done.
func settle(err error, cancel context.CancelFunc, wg *sync.WaitGroup, errs []error) error {
	if err != nil {
		cancel()
	}
	wg.Wait()
	if err == nil {
		err = firstErr(errs)
	}
	return err
}

// firstError keeps the first error of a collective's concurrent sends and
// receives and cancels their context with it as the cause when it comes:
// the errors that cancellation causes after it are not the cause, and a
// consumer that stops waiting answers its sender with it (Comm.gaveUp).
// Safe for concurrent use; the zero value with cancel set is ready.
type firstError struct {
	mu     sync.Mutex
	err    error
	cancel context.CancelCauseFunc
}

// set records err if it is the first, and cancels with it.
func (f *firstError) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
		f.cancel(err)
	}
}

// get returns the first error set, or nil.
func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// hierRuns is each collective's data phase by levels, a row per kind
// (Allreduce's is the default).
var hierRuns = map[kind]func(h *hierState, ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error{
	kindBcast:         (*hierState).bcast,
	kindAllgather:     (*hierState).allgather,
	kindReduce:        (*hierState).reduce,
	kindReduceScatter: (*hierState).reduceScatter,
	kindGather:        (*hierState).gather,
	kindScatter:       (*hierState).scatter,
	kindAlltoall:      (*hierState).alltoall,
}
