package collective

import (
	"context"
	"sync"
)

// Gather and Scatter of a hierarchical communicator, by levels, as Bcast
// and Allgather (hier_move.go): through each host's shared mappings within
// it, over TCP between hosts only, one rank per host: the root on its
// host, the leader on every other (bcastRep). Both run in the host's
// phases 3k+1 to 3k+3 and file set k&1 (hierState.k), and both move a
// host's pieces as one *block*: its ranks' pieces in host order
// (hostOrder), each in C order.
//
// Gather: every rank but the root publishes its input in its data file
// (3k+1); another host's leader stages its host's block in its data file
// from there and sends it to the root (step 0); the root receives the
// blocks while it copies its host-mates' inputs from their files into
// place, then places the blocks' inputs. A rank that is not its host's
// representative is done once it has published.
//
// Scatter: the root cuts each other host's block from its tensor and
// sends it to that host's leader (step 0), which receives it into its
// data file and publishes it (3k+1); the root publishes its own host's
// block in its data file while the blocks travel. Every rank copies its
// piece from its host's representative's file.

// gather is the data phase of Gather number k through the host's mappings
// (file set k&1, phases 3k+1 to 3k+3), seq the communicator's.
func (h *hierState) gather(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	g, me, root := h.g, c.rank, p.root
	set, base := int(k&1), uint32(3*k)
	off, hoff := h.hostOrder(p.bytes)
	if rep := h.bcastRep(root); me != rep {
		// A host-mate: its representative reads its input from its file.
		mine, err := publishIn(ctx, g, k, len(in))
		if err != nil {
			return err
		}
		copy(mine, in)
		g.setPhase(base + 1)
		g.setPhase(base + 3)
		return nil
	}
	x := &xfer{c: c, ctx: ctx, seq: seq}
	if me != root {
		// Another host's leader: its host's block to the root.
		block := in
		if g != nil {
			var err error
			if block, err = publishIn(ctx, g, k, hoff[h.host+1]-hoff[h.host]); err != nil {
				return err
			}
			copy(block[off[me]-hoff[h.host]:], in)
			g.setPhase(base + 1)
			if err := g.waitAll(ctx, base+1); err != nil {
				return err
			}
			for j := 1; j < len(h.ranks); j++ {
				r := h.ranks[j]
				b, err := g.peerData(j, set, p.bytes(r))
				if err != nil {
					return err
				}
				copy(block[off[r]-hoff[h.host]:], b)
			}
		}
		var err error
		if len(block) > 0 {
			err = x.exchangeAt(0, root, block, -1, 0, nil)
		}
		if g != nil {
			g.setPhase(base + 3)
		}
		return err
	}
	// The root: the other hosts' blocks arrive while it places its
	// host's inputs.
	xctx, cancel := context.WithCancel(ctx)
	defer cancel()
	x.ctx = xctx
	H := len(h.leaders)
	blocks := make([][]byte, H)
	errs := make([]error, H)
	var wg sync.WaitGroup
	for o := range H {
		if o == h.host || hoff[o+1] == hoff[o] {
			continue
		}
		blocks[o] = make([]byte, hoff[o+1]-hoff[o])
		wg.Go(func() {
			if errs[o] = x.exchangeAt(0, -1, nil, h.leaders[o], len(blocks[o]), into(blocks[o])); errs[o] != nil {
				cancel()
			}
		})
	}
	place := placeGathered(p, me, out)
	err := func() error {
		place(me, in)
		if g == nil {
			return nil
		}
		g.setPhase(base + 1)
		if err := g.waitAll(ctx, base+1); err != nil {
			return err
		}
		for j, r := range h.ranks {
			if r == me {
				continue
			}
			b, err := g.peerData(j, set, p.bytes(r))
			if err != nil {
				return err
			}
			place(r, b)
		}
		return nil
	}()
	if err := settle(err, cancel, &wg, errs); err != nil {
		return err
	}
	for r, hh := range h.hosts {
		if hh != h.host {
			place(r, blocks[hh][off[r]-hoff[hh]:off[r]-hoff[hh]+p.bytes(r)])
		}
	}
	if g != nil {
		g.setPhase(base + 3)
	}
	return nil
}

// scatter is the data phase of Scatter number k through the host's
// mappings (file set k&1, phases 3k+1 to 3k+3), seq the communicator's.
func (h *hierState) scatter(ctx context.Context, c *Comm, seq, k uint64, p *plan, in, out []byte) error {
	g, me, root, es := h.g, c.rank, p.root, p.esize
	set, base := int(k&1), uint32(3*k)
	piece := func(r int) int { return numel(p.outShape(r)) * es }
	off, hoff := h.hostOrder(piece)
	myBlock := hoff[h.host+1] - hoff[h.host]
	rep := h.bcastRep(root)
	if me != rep {
		// A host-mate: its piece from its representative's file.
		li := h.index(rep)
		if err := g.waitRank(ctx, li, base+1); err != nil {
			return err
		}
		b, err := g.peerData(li, set, myBlock)
		if err != nil {
			return err
		}
		copy(out, b[off[me]-hoff[h.host]:])
		g.setPhase(base + 3)
		return nil
	}
	x := &xfer{c: c, ctx: ctx, seq: seq}
	if me != root {
		// Another host's leader: its host's block from the root, into
		// its data file (alone on its host: its piece, into out).
		if g == nil {
			if len(out) == 0 {
				return nil
			}
			return x.exchangeAt(0, -1, nil, root, len(out), into(out))
		}
		mine, err := publishIn(ctx, g, k, myBlock)
		if err != nil {
			return err
		}
		if myBlock > 0 {
			if err := x.exchangeAt(0, -1, nil, root, myBlock, into(mine)); err != nil {
				return err
			}
		}
		g.setPhase(base + 1)
		copy(out, mine[off[me]-hoff[h.host]:])
		g.setPhase(base + 3)
		return nil
	}
	// The root: every other host's block on its way, then its own host's
	// published and its piece in place while they travel.
	shape := p.shapes[root]
	cpre := prefix(p.counts)
	cut := func(dst []byte, r int) {
		box := p.outShape(r)
		boxCopy(dst, box, zeros(len(box)), in, shape, at(len(shape), p.axis, cpre[r]), box, es)
	}
	xctx, cancel := context.WithCancel(ctx)
	defer cancel()
	x.ctx = xctx
	H := len(h.leaders)
	errs := make([]error, H)
	var wg sync.WaitGroup
	for o := range H {
		if o == h.host || hoff[o+1] == hoff[o] {
			continue
		}
		block := make([]byte, hoff[o+1]-hoff[o])
		for _, r := range h.byHost[o] {
			cut(block[off[r]-hoff[o]:], r)
		}
		wg.Go(func() {
			if errs[o] = x.exchangeAt(0, h.leaders[o], block, -1, 0, nil); errs[o] != nil {
				cancel()
			}
		})
	}
	err := func() error {
		if g != nil {
			mine, err := publishIn(ctx, g, k, myBlock)
			if err != nil {
				return err
			}
			for _, r := range h.ranks {
				if r != me {
					cut(mine[off[r]-hoff[h.host]:], r)
				}
			}
			g.setPhase(base + 1)
		}
		cut(out, me)
		return nil
	}()
	err = settle(err, cancel, &wg, errs)
	if err == nil && g != nil {
		g.setPhase(base + 3)
	}
	return err
}
