package collective

import (
	"context"
	"sync"
)

// Alltoall of a hierarchical communicator, by levels, as Allgather
// (hier_move.go): through each host's shared mappings within it, over TCP
// between each pair of hosts' leaders only. It runs in the host's phases
// 3k+1 to 3k+3 and file set k&1 (hierState.k).
//
// Every rank publishes its input in its data file (3k+1) and copies the
// pieces its host-mates have for it from their files. Each leader cuts,
// from its host's files, the block its host sends each other host: for
// each of its ranks ascending, the piece for each of the other host's
// ranks ascending, each in C order; it sends that block to the other
// host's leader (step 0) and receives that host's block for its own host
// into its data file, after its input (3k+2); its host-mates copy their
// pieces from there. So each pair of hosts exchanges one block each way,
// and no byte moves between ranks of one host over TCP.

// a2aPiece returns the bytes of the piece rank r sends rank d.
func a2aPiece(p *plan, r, d int) int {
	if p.shapes[r] == nil {
		return 0
	}
	return numel(along(p.shapes[r], p.axis2, p.counts[d])) * p.esize
}

// a2aBlock returns the layout of the block host a sends host b: at[i][j]
// is the offset of the piece from a's i-th rank to b's j-th, and size the
// block's bytes.
func (h *hierState) a2aBlock(p *plan, a, b int) (at [][]int, size int) {
	at = make([][]int, len(h.byHost[a]))
	for i, r := range h.byHost[a] {
		at[i] = make([]int, len(h.byHost[b]))
		for j, d := range h.byHost[b] {
			at[i][j] = size
			size += a2aPiece(p, r, d)
		}
	}
	return at, size
}

// alltoallReserve returns the room a rank reserves for Alltoall d before
// the check: its input, and on a leader the blocks the other hosts send,
// guessed from its own input (every rank's as large, split by d's counts).
func (h *hierState) alltoallReserve(c *Comm, d *desc, in int) int {
	if h.local != 0 {
		return in
	}
	n, L := c.size, len(h.ranks)
	if d.counts == nil {
		return in + in/n*L*(n-L)
	}
	if len(d.counts) != n || d.axis2 < 0 || d.axis2 >= len(d.shape) || !splits(d.counts, d.shape[d.axis2]) {
		return in // the check fails it (splits: before multiplying the counts)
	}
	total, mine := 0, 0
	for r, v := range d.counts {
		total += v
		if h.hosts[r] == h.host {
			mine += v
		}
	}
	if total <= 0 || mine <= 0 {
		return in
	}
	return in + in/total*mine*(n-L)
}

// alltoall is the data phase of Alltoall number k through the host's
// mappings (file set k&1, phases 3k+1 to 3k+3), seq the communicator's.
func (h *hierState) alltoall(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	g, me, es := h.g, c.rank, p.esize
	set, base := int(k&1), uint32(3*k)
	H := len(h.leaders)
	oshape := p.outShape(me)
	pre, cpre := prefix(p.sizes), prefix(p.counts)
	// put places piece b (C order) from rank r in out.
	put := func(r int, b []byte) {
		box := along(p.shapes[r], p.axis2, p.counts[me])
		boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), b, box, zeros(len(box)), box, es)
	}
	// The blocks for this host, in host order, after the leader's input.
	lead := p.bytes(h.ranks[0])
	roff := make([]int, H+1)
	for o := range H {
		roff[o+1] = roff[o]
		if o != h.host {
			_, n := h.a2aBlock(p, o, h.host)
			roff[o+1] += n
		}
	}
	// placeBlocks places this rank's pieces of the blocks in recv (the
	// blocks from the other hosts, laid out by roff).
	j := h.local
	placeBlocks := func(recv []byte) {
		for o := range H {
			if o == h.host {
				continue
			}
			offs, _ := h.a2aBlock(p, o, h.host)
			for i, r := range h.byHost[o] {
				put(r, recv[roff[o]+offs[i][j]:roff[o]+offs[i][j]+a2aPiece(p, r, me)])
			}
		}
	}
	leader := h.local == 0
	srcs := make([][]byte, len(h.ranks))
	srcs[h.local] = in
	var recv []byte
	if g == nil {
		recv = make([]byte, roff[H])
		if overlaps(in, out) {
			// AlltoallInto in place: the pieces are cut after out is
			// written.
			srcs[h.local] = append([]byte(nil), in...)
		}
	} else {
		want := len(in)
		if leader {
			want += roff[H]
		}
		mine, err := publishIn(ctx, g, k, want)
		if err != nil {
			return err
		}
		copy(mine, in)
		// The pieces are cut from the copy: out may be the input.
		srcs[h.local], recv = mine[:len(in)], mine[len(in):]
		g.setPhase(base + 1)
		if err := g.waitAll(ctx, base+1); err != nil {
			return err
		}
		for i, r := range h.ranks {
			if r == me {
				continue
			}
			if srcs[i], err = g.peerData(i, set, p.bytes(r)); err != nil {
				return err
			}
		}
	}
	// The host's pieces for this rank, from their files.
	local := func() {
		for i, r := range h.ranks {
			box := along(p.shapes[r], p.axis2, p.counts[me])
			boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), srcs[i], p.shapes[r], at(len(oshape), p.axis2, cpre[me]), box, es)
		}
	}
	if !leader {
		local()
		if err := g.waitRank(ctx, 0, base+2); err != nil {
			return err
		}
		b, err := g.peerData(0, set, lead+roff[H])
		if err != nil {
			return err
		}
		placeBlocks(b[lead:])
		g.setPhase(base + 3)
		return nil
	}
	// The leaders: a block to and from every other host at once.
	x := &xfer{c: c, ctx: ctx, seq: seq}
	var wg sync.WaitGroup
	errs := make([]error, H)
	for o := range H {
		if o == h.host {
			continue
		}
		offs, n := h.a2aBlock(p, h.host, o)
		block := make([]byte, n)
		for i, r := range h.ranks {
			for jj, d := range h.byHost[o] {
				box := along(p.shapes[r], p.axis2, p.counts[d])
				boxCopy(block[offs[i][jj]:], box, zeros(len(box)), srcs[i], p.shapes[r], at(len(box), p.axis2, cpre[d]), box, es)
			}
		}
		to, from := h.leaders[o], h.leaders[o]
		if n == 0 {
			to = -1
		}
		if roff[o+1] == roff[o] {
			from = -1
		}
		if to < 0 && from < 0 {
			continue
		}
		wg.Go(func() { errs[o] = x.exchangeAt(0, to, block, from, roff[o+1]-roff[o], into(recv[roff[o]:roff[o+1]])) })
	}
	local()
	wg.Wait()
	if err := firstErr(errs); err != nil {
		return err
	}
	if g != nil {
		g.setPhase(base + 2)
	}
	placeBlocks(recv)
	if g != nil {
		g.setPhase(base + 3)
	}
	return nil
}
