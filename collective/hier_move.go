package collective

import (
	"context"
	"slices"
	"sync"
)

// Bcast and Allgather of a hierarchical communicator, by levels, as
// Allreduce (hier_ops.go): through each host's shared mappings within it,
// over TCP between hosts only, one rank per host. Both run in the host's
// phases 3k+1 to 3k+3 and file set k&1 (k: the host's count of
// collectives that went through its mappings, hierState.k).
//
// Bcast: a binomial tree over the hosts, of one rank each (the root on
// its host, the leader on every other), carries the tensor between
// hosts; that rank writes it once into its data file (phase 3k+1) and its
// host's other ranks copy it from there. The root publishes before it
// sends, so its host-mates copy while the tensor travels.
//
// Allgather: every rank publishes its input in its data file (3k+1); the
// leader stages the host's inputs as one block in its data file, which
// holds every rank's input in host order (host 0's ranks, ascending, then
// host 1's ...), exchanges blocks with every other leader, receiving
// theirs into place (3k+2), and every rank of the host copies each rank's
// input from the leader's file into its place in the result, in rank
// order whatever the layout. A host-mate copies its own host's inputs
// from their files while the leaders exchange.

// hierReserve returns how many bytes this rank will write into its data
// file for cl, when it knows before the check: the room reserved before
// the descriptions go out, so that a full folder is ErrNoSpace on every
// rank. 0: nothing, or not known yet (a Bcast's host rank that passed no
// tensor: its room is reserved after the check, and a failure then breaks
// the communicator; an Allgather's leader reserves for every rank's input
// as large as its own, and grows after the check when they are larger).
func (h *hierState) hierReserve(c *Comm, d *desc, in []byte) int {
	switch d.kind {
	case kindAllreduce, kindReduce, kindReduceScatter:
		return len(in)
	case kindBcast:
		if d.root < 0 || d.root >= c.size || h.bcastRep(d.root) != c.rank {
			return 0
		}
		return numel(d.shape) * d.dtype.Size()
	case kindAllgather:
		if h.local == 0 {
			return len(in) * c.size
		}
		return len(in)
	case kindGather:
		// The root publishes nothing; another host's leader stages its
		// host's inputs, each guessed as large as its own.
		switch {
		case d.root < 0 || d.root >= c.size || d.root == c.rank:
			return 0
		case h.bcastRep(d.root) == c.rank:
			return len(in) * len(h.ranks)
		}
		return len(in)
	case kindScatter:
		// The root publishes its host-mates' pieces (the others know
		// theirs only after the check).
		if d.root == c.rank && len(h.ranks) > 1 {
			return h.scatterHostBytes(c, d)
		}
	case kindAlltoall:
		return h.alltoallReserve(c, d, len(in))
	}
	return 0
}

// scatterHostBytes returns the bytes of the pieces of Scatter d (from this
// rank, the root) that go to this rank's host-mates, 0 when d is not a
// valid Scatter (the check fails it). It runs before the check, so it
// checks the counts itself (splits) before it multiplies them: counts
// whose sum wraps around would make a size of any value.
func (h *hierState) scatterHostBytes(c *Comm, d *desc) int {
	if d.axis < 0 || d.axis >= len(d.shape) {
		return 0
	}
	counts := d.counts
	if counts == nil {
		if d.shape[d.axis]%c.size != 0 {
			return 0
		}
		counts = evenCounts(d.shape[d.axis], c.size)
	}
	if len(counts) != c.size || d.shape[d.axis] == 0 || !splits(counts, d.shape[d.axis]) {
		return 0
	}
	row := numel(d.shape) / d.shape[d.axis] * d.dtype.Size()
	n := 0
	for _, r := range h.ranks {
		if r != c.rank && counts[r] > 0 {
			n += counts[r] * row
		}
	}
	return n
}

// hierMoves reports whether collective k goes by the hierarchy's levels
// (the others go between every pair of ranks over TCP). It depends on the
// kind only, so every rank takes the same path for the same call.
func hierMoves(k kind) bool {
	switch k {
	case kindAllreduce, kindBcast, kindAllgather, kindReduce, kindReduceScatter, kindGather, kindScatter, kindAlltoall:
		return true
	}
	return false
}

// bcastRep returns the rank of this rank's host that receives a Bcast
// from root between hosts: root on root's host, the leader elsewhere.
func (h *hierState) bcastRep(root int) int {
	if h.hosts[root] == h.host {
		return root
	}
	return h.ranks[0]
}

// bcast is the data phase of Bcast number k through the host's mappings
// (file set k&1, phases 3k+1 to 3k+3), seq the communicator's.
func (h *hierState) bcast(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	g, me := h.g, c.rank
	set, base := int(k&1), uint32(3*k)
	rep := h.bcastRep(p.root)
	size := p.bytes(p.root)
	if me != rep {
		// A host-mate: the host's rank that has the tensor publishes it.
		li := h.index(rep)
		if err := g.waitRank(ctx, li, base+1); err != nil {
			return err
		}
		b, err := g.peerData(li, set, size)
		if err != nil {
			return err
		}
		copy(out, b)
		g.setPhase(base + 3)
		return nil
	}
	// One rank per host, by host index; this host's is this rank.
	reps := slices.Clone(h.leaders)
	reps[h.hosts[p.root]] = p.root
	var mine []byte
	if g != nil {
		var err error
		if mine, err = publishIn(ctx, g, k, size); err != nil {
			return err
		}
	}
	x := &xfer{c: c, ctx: ctx, seq: seq}
	if me == p.root {
		// The root sends from its tensor, and publishes it for its
		// host-mates while the sends go.
		err := x.tree(reps, h.host, h.hosts[p.root], in, func() error {
			if g != nil {
				copy(mine, in)
				g.setPhase(base + 1)
			}
			if !sameMem(out, in) {
				copy(out, in)
			}
			return nil
		})
		if err != nil {
			return err
		}
	} else {
		// Another host's: the tensor arrives in its data file (or, alone
		// on its host, its output), goes on down the tree from there,
		// and to its host-mates and its output at once.
		buf := out
		if g != nil {
			buf = mine
		}
		err := x.tree(reps, h.host, h.hosts[p.root], buf, func() error {
			if g != nil {
				g.setPhase(base + 1)
				copy(out, mine)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if g != nil {
		g.setPhase(base + 3)
	}
	return nil
}

// hostOrder lays out one block per rank in host order (host 0's ranks,
// ascending, then host 1's ...), rank r's of size(r) bytes: off[r] is its
// offset, host hh's block is [hoff[hh], hoff[hh+1]).
func (h *hierState) hostOrder(size func(r int) int) (off, hoff []int) {
	off, hoff = make([]int, len(h.hosts)), make([]int, len(h.byHost)+1)
	for hh, rs := range h.byHost {
		hoff[hh+1] = hoff[hh]
		for _, r := range rs {
			off[r] = hoff[hh+1]
			hoff[hh+1] += size(r)
		}
	}
	return off, hoff
}

// placeGathered returns what puts rank r's input b (in C order) in its
// place along the axis of rank me's result out, of a Gather or an
// Allgather.
func placeGathered(p *plan, me int, out []byte) func(r int, b []byte) {
	oshape := p.outShape(me)
	pre := prefix(p.sizes)
	return func(r int, b []byte) {
		boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), b, p.shapes[r], zeros(len(oshape)), p.shapes[r], p.esize)
	}
}

// index returns rank r's index among this host's ranks.
func (h *hierState) index(r int) int {
	for i, q := range h.ranks {
		if q == r {
			return i
		}
	}
	return -1
}

// allgather is the data phase of Allgather number k through the host's
// mappings (file set k&1, phases 3k+1 to 3k+3), seq the communicator's.
func (h *hierState) allgather(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	g, me, n := h.g, c.rank, c.size
	set, base := int(k&1), uint32(3*k)
	// Every rank's input in host order.
	H := len(h.leaders)
	off, hoff := h.hostOrder(p.bytes)
	total := hoff[H]
	leader := h.local == 0
	var stage []byte
	if g == nil {
		// Alone on its host: the stage is this rank's own.
		stage = make([]byte, total)
		copy(stage[off[me]:], in)
	} else {
		want := len(in)
		if leader {
			want = total
		}
		b, err := publishIn(ctx, g, k, want)
		if err != nil {
			return err
		}
		if leader {
			stage = b
			copy(stage[off[me]:], in)
		} else {
			copy(b, in)
		}
		g.setPhase(base + 1)
		if err := g.waitAll(ctx, base+1); err != nil {
			return err
		}
		if leader {
			for j := 1; j < len(h.ranks); j++ {
				r := h.ranks[j]
				b, err := g.peerData(j, set, p.bytes(r))
				if err != nil {
					return err
				}
				copy(stage[off[r]:], b)
			}
		}
	}
	place := placeGathered(p, me, out)
	if !leader {
		// The host's inputs from their files while the leaders exchange,
		// then the others' from the leader's.
		for j, r := range h.ranks {
			var b []byte
			var err error
			switch {
			case r == me:
				b = in
			case j == 0:
				b, err = g.peerData(0, set, off[r]+p.bytes(r))
				b = b[off[r]:]
			default:
				b, err = g.peerData(j, set, p.bytes(r))
			}
			if err != nil {
				return err
			}
			place(r, b)
		}
		if err := g.waitRank(ctx, 0, base+2); err != nil {
			return err
		}
		stage, err := g.peerData(0, set, total)
		if err != nil {
			return err
		}
		for r := range n {
			if h.hosts[r] != h.host {
				place(r, stage[off[r]:off[r]+p.bytes(r)])
			}
		}
		g.setPhase(base + 3)
		return nil
	}
	// The leaders: each sends its host's block to every other, and
	// receives theirs into place.
	x := &xfer{c: c, ctx: ctx, seq: seq}
	var wg sync.WaitGroup
	errs := make([]error, H)
	mine := stage[hoff[h.host]:hoff[h.host+1]]
	for o := range H {
		if o == h.host {
			continue
		}
		theirs := stage[hoff[o]:hoff[o+1]]
		wg.Go(func() { errs[o] = x.exchangeAt(0, h.leaders[o], mine, h.leaders[o], len(theirs), into(theirs)) })
	}
	wg.Wait()
	if err := firstErr(errs); err != nil {
		return err
	}
	if g != nil {
		g.setPhase(base + 2)
	}
	for r := range n {
		place(r, stage[off[r]:off[r]+p.bytes(r)])
	}
	if g != nil {
		g.setPhase(base + 3)
	}
	return nil
}

// publishIn publishes size bytes in this rank's data file of collective
// k's file set (shmGroup.publish) once the host's ranks are done with it:
// they last read it in collective k-2 (phase 3(k-2)+3). A failure to
// publish is the rank's own (ownErr); the wait's error is as it comes.
func publishIn(ctx context.Context, g *shmGroup, k uint64, size int) ([]byte, error) {
	if k >= 2 {
		if err := g.waitAll(ctx, uint32(3*k)-3); err != nil {
			return nil, err
		}
	}
	b, err := g.publish(int(k&1), size)
	if err != nil {
		return nil, ownErr(err)
	}
	return b, nil
}
