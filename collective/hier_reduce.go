package collective

import (
	"context"
	"sync"
	"unsafe"
)

// Reduce and ReduceScatter of a hierarchical communicator, by levels, as
// Allreduce (hier_ops.go): through each host's shared mappings within it,
// over TCP between hosts only. Both run in the host's phases 3k+1 to 3k+3
// and file set k&1 (hierState.k).
//
// Both cut the tensor into pieces, each finished on one rank, its *dest*:
// ReduceScatter's piece r (along the axis) on rank r; Reduce's piece j of
// L_R equal flat ranges (L_R the root's host's ranks) on the root host's
// j-th rank. Every rank publishes its input in its data file (3k+1).
// Then, on every host, one rank reduces the host's partial of each piece
// from the host's mappings: the dest itself on its own host; on the
// others, the pieces whose dest is elsewhere go round-robin over the
// host's ranks, in piece order (on hosts of equal sizes: the rank at the
// dest's index in its host, as Allreduce's peers). That rank sends the
// partial straight to the dest, which reduces the H partials in host
// order into its piece. So each host's partial of each piece crosses
// between hosts once, every rank of every host works, and no byte moves
// between ranks of one host over TCP. Reduce's root then copies the
// pieces of its host-mates from their data files (3k+3).
//
// The order of every element's reduction: each host's ranks ascending
// (the host's partial), then the partials in host order:
// (x_a op x_b op ...) op (x_c op ...) op ..., hosts numbered by their
// lowest rank; every run gives the same bits.

// hierPieces says how a reduction by levels cuts the tensor.
type hierPieces struct {
	dest []int // the rank each piece is finished on
	size []int // each piece's bytes
	// flat, when not nil, is each piece's range of the tensor's bytes:
	// piece i is [flat[i], flat[i+1]) (Reduce; ReduceScatter when the
	// axis has only dimensions of 1 before it). Then a rank does not
	// publish the pieces it reduces itself (it reads them from its
	// tensor), and those ranges of its data file are free: it reduces the
	// partials it sends there (alone on its host, it sends its tensor's
	// range), and a dest of Reduce its result.
	flat []int
	// reduce sets dst (size[i] bytes, in C order) to piece i of the
	// reduction of srcs (the host's inputs, in its ranks' order).
	reduce func(i int, dst []byte, srcs [][]byte)
}

// workers returns, for each piece, the rank of host hh that reduces that
// host's partial of it: the dest on its own host; else the pieces with a
// dest elsewhere go round-robin over hh's ranks in piece order.
func (h *hierState) workers(pc *hierPieces, hh int) []int {
	rs := h.byHost[hh]
	w := make([]int, len(pc.dest))
	q := 0
	for i, d := range pc.dest {
		if h.hosts[d] == hh {
			w[i] = d
			continue
		}
		w[i] = rs[q%len(rs)]
		q++
	}
	return w
}

// reduceLevels is the data phase of a reduction by levels (collective
// number k of the host's group, seq the communicator's) up to each dest's
// result: it publishes in (phase 3k+1), reduces this rank's share of its
// host's partials and sends those of pieces with a dest on another host,
// and, for the piece whose dest is this rank (if any), reduces the host
// partials in host order into final(mine), mine this rank's data file of
// set k&1 (nil alone on a host). The caller moves the phase to 3k+3.
func (h *hierState) reduceLevels(ctx context.Context, c *Comm, seq, k uint64, p *plan, in []byte, pc *hierPieces, final func(i int, mine []byte) []byte) error {
	g, me := h.g, c.rank
	set, base := int(k&1), uint32(3*k)
	H := len(h.leaders)
	work := h.workers(pc, h.host)
	L := len(h.ranks)
	srcs := [][]byte{in}
	var mine []byte
	if g != nil {
		var err error
		if mine, err = publishIn(ctx, g, k, len(in)); err != nil {
			return err
		}
		if pc.flat == nil {
			copy(mine, in)
		} else {
			for i, w := range work {
				if w != me {
					copy(mine[pc.flat[i]:pc.flat[i+1]], in[pc.flat[i]:pc.flat[i+1]])
				}
			}
		}
		g.setPhase(base + 1)
		if err := g.waitAll(ctx, base+1); err != nil {
			return err
		}
		srcs = make([][]byte, L)
		for j := range L {
			if j == h.local {
				srcs[j] = in
				continue
			}
			if srcs[j], err = g.peerData(j, set, len(in)); err != nil {
				return err
			}
		}
	}

	xctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	x := &xfer{c: c, ctx: xctx, seq: seq}
	var recvs, sends sync.WaitGroup
	fe := &firstError{cancel: cancel}
	// The other hosts' partials of our piece: posted first, as they may
	// come at once.
	own := -1
	var parts [][]byte
	for i, d := range pc.dest {
		if d == me {
			own = i
		}
	}
	if own >= 0 && pc.size[own] > 0 {
		parts = make([][]byte, H)
		for hh := range H {
			if hh == h.host {
				continue
			}
			from := h.workers(pc, hh)[own]
			parts[hh] = make([]byte, pc.size[own])
			recvs.Go(func() {
				if err := x.exchangeAt(0, -1, nil, from, pc.size[own], into(parts[hh])); err != nil {
					fe.set(err)
				}
			})
		}
	}
	// Our host's partials of the pieces finished elsewhere, each sent as
	// soon as it is reduced.
	for i, w := range work {
		if w != me || h.hosts[pc.dest[i]] == h.host || pc.size[i] == 0 {
			continue
		}
		var buf []byte
		switch {
		case pc.flat != nil && len(srcs) == 1:
			// Alone on its host: the host's partial is the input.
			buf = in[pc.flat[i]:pc.flat[i+1]]
		case pc.flat != nil:
			// The piece's range of our data file, not published.
			buf = mine[pc.flat[i]:pc.flat[i+1]]
		default:
			buf = make([]byte, pc.size[i])
		}
		if len(srcs) > 1 || pc.flat == nil {
			if err := guardOwn(func() error { pc.reduce(i, buf, srcs); return nil }); err != nil {
				fe.set(err)
				break
			}
		}
		to := pc.dest[i]
		sends.Go(func() {
			if err := x.exchangeAt(0, to, buf, -1, 0, nil); err != nil {
				fe.set(err)
			}
		})
	}
	if own >= 0 && pc.size[own] > 0 && fe.get() == nil {
		dst := final(own, mine)
		// Our host's partial, straight into the result when it comes
		// first (reduceN's dst may be its first source) and does not
		// overlap the input.
		var err error
		switch {
		case pc.flat != nil && len(srcs) == 1 && !overlaps(dst, in):
			// Alone on its host: the host's partial is the input.
			parts[h.host] = in[pc.flat[own]:pc.flat[own+1]]
		case h.host == 0 && !overlaps(dst, in):
			parts[0] = dst
			err = guardOwn(func() error { pc.reduce(own, dst, srcs); return nil })
		default:
			parts[h.host] = make([]byte, pc.size[own])
			err = guardOwn(func() error { pc.reduce(own, parts[h.host], srcs); return nil })
		}
		if err != nil {
			fe.set(err)
		} else {
			recvs.Wait()
			if fe.get() == nil {
				reduceN(p.op, p.dt, dst, parts)
			}
		}
	}
	recvs.Wait()
	sends.Wait()
	return fe.get()
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// reduceScatter is the data phase of ReduceScatter number k through the
// host's mappings (file set k&1, phases 3k+1 to 3k+3), seq the
// communicator's: piece r along the axis finished on rank r, into out.
func (h *hierState) reduceScatter(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	n, es := c.size, p.esize
	shape := p.shapes[c.rank]
	pre := prefix(p.counts)
	pc := &hierPieces{dest: make([]int, n), size: make([]int, n)}
	for r := range n {
		pc.dest[r] = r
		pc.size[r] = numel(along(shape, p.axis, p.counts[r])) * es
	}
	if numel(shape[:p.axis]) == 1 {
		// Every piece is a range of the tensor's bytes.
		row := numel(shape[p.axis+1:]) * es
		pc.flat = make([]int, n+1)
		for r := range n {
			pc.flat[r+1] = pre[r+1] * row
		}
	}
	var run [][]byte
	pc.reduce = func(i int, dst []byte, srcs [][]byte) {
		box := along(shape, p.axis, p.counts[i])
		if run == nil {
			run = make([][]byte, len(srcs))
		}
		boxRuns([][]int{box, shape}, [][]int{zeros(len(box)), at(len(shape), p.axis, pre[i])}, box, es, func(a []int, m int) {
			for j, s := range srcs {
				run[j] = s[a[1] : a[1]+m]
			}
			reduceN(p.op, p.dt, dst[a[0]:a[0]+m], run)
		})
	}
	err := h.reduceLevels(ctx, c, seq, k, p, in, pc, func(int, []byte) []byte { return out })
	if err == nil && h.g != nil {
		h.g.setPhase(uint32(3*k) + 3)
	}
	return err
}

// reduce is the data phase of Reduce number k through the host's mappings
// (file set k&1, phases 3k+1 to 3k+3), seq the communicator's: the root
// host's rank j finishes piece j of the tensor in its data file (the
// root: in out) and moves its phase to 3k+3; the root then copies the
// others' pieces into out. The other ranks' out is zeros.
func (h *hierState) reduce(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	me, root, es := c.rank, p.root, p.esize
	rs := h.byHost[h.hosts[root]]
	flat := scale(chunks(len(in)/max(es, 1), len(rs)), es)
	pc := &hierPieces{dest: rs, size: make([]int, len(rs)), flat: flat}
	for j := range rs {
		pc.size[j] = flat[j+1] - flat[j]
	}
	run := make([][]byte, max(len(h.ranks), 1))
	pc.reduce = func(i int, dst []byte, srcs [][]byte) {
		for j, s := range srcs {
			run[j] = s[flat[i]:flat[i+1]]
		}
		reduceN(p.op, p.dt, dst, run[:len(srcs)])
	}
	err := h.reduceLevels(ctx, c, seq, k, p, in, pc, func(i int, mine []byte) []byte {
		if me == root {
			return out[flat[i]:flat[i+1]]
		}
		return mine[flat[i]:flat[i+1]]
	})
	if err != nil {
		return err
	}
	g, base := h.g, uint32(3*k)
	if me != root {
		if g != nil {
			g.setPhase(base + 3)
		}
		// After the reads: out may be the input (ReduceInto in place).
		clear(out)
		return nil
	}
	if g != nil {
		if err := g.waitAll(ctx, base+3); err != nil {
			return err
		}
		for j, r := range rs {
			if r == me || flat[j+1] == flat[j] {
				continue
			}
			b, err := g.peerData(j, int(k&1), len(in))
			if err != nil {
				return err
			}
			copy(out[flat[j]:flat[j+1]], b[flat[j]:flat[j+1]])
		}
		g.setPhase(base + 3)
	}
	return nil
}
