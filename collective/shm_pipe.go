package collective

import "context"

// The pipelined reduction through shared mappings: Allreduce (above
// smallShm) and Reduce. The tensor is cut into chunks of pipeShare bytes
// a rank, n shares each; a chunk moves in three steps on every rank, each
// a move of its progress word (ctlProg, shm_linux.go):
//
//	in(c)   the rank has copied chunk c of its input, all but its own
//	        share, into slot c mod pipeSlots of its data file (the first
//	        pipeSlots-1 chunks with the publish, before the published
//	        phase, and their in events at the data phase's start; a rank
//	        whose tensors are shared buffers copies them in only then)
//	red(c)  it has reduced its share of chunk c, reading the others'
//	        slots in place and its own share from its input, into that
//	        share of its own slot (which no other rank reads as input)
//	out(c)  it has copied every rank's reduced share of chunk c from their
//	        slots into its output (Reduce: the root only; the others move
//	        the word all the same)
//
// Before red(c) a rank waits for every rank's in(c); before out(c) for
// every rank's red(c); before in(c) into a slot that chunk c-pipeSlots
// used, for every rank's out(c-pipeSlots), the last read of it. A rank's
// data file holds pipeSlots chunks, not the tensor: what the ranks copy
// in is read back by the others while it is still in the caches, and only
// the input and the output go to memory. Every element is reduced by one
// rank, in rank order, so every rank gets the same bits, those of the
// small path (every rank reducing the whole tensor in rank order).
//
// The events of a rank follow one order, in(0) .. in(pipeSlots-2), then
// for each chunk c: in(c+pipeSlots-1) (if there is such a chunk), red(c),
// out(c); its progress word counts them, from where the previous
// pipelined collective left it (shmGroup.prog: every rank moves it by the
// same steps in each). A peer waiting for an event waits for the word to
// reach that event's number (reached: modulo wrap-around).

// pipeShare is the bytes of a chunk each rank reduces: a chunk of n ranks
// is n times that, and a rank's data file holds pipeSlots chunks.
const pipeShare = 256 << 10

// pipeSlots is how many chunks a rank's data file holds: a rank copies
// chunk c+1 in while slower ranks still read chunk c.
const pipeSlots = 2

// pipelined reports whether the collective of kind k on bytes of input
// per rank is the pipelined reduction (its publish only sizes the file).
func pipelined(k kind, bytes int) bool {
	return k == kindReduce || k == kindAllreduce && bytes > smallShm
}

// pipeSched is what the pipelined collectives share (the reduction here,
// the ReduceScatter in shm_rspipe.go): k chunks through pipeSlots slots
// of slotLen bytes, and the numbers of the events that move the progress
// word. A chunk takes step events: in, red and, for the reduction, out.
type pipeSched struct {
	step    int // events a chunk: 3 (in, red, out) or 2 (in, red)
	k       int // chunks
	slotLen int // bytes of a slot
}

// slot returns the slot of chunk c in a rank's area.
func (l *pipeSched) slot(area []byte, c int) []byte {
	i := c % pipeSlots
	return area[i*l.slotLen : (i+1)*l.slotLen]
}

// The events' numbers, counted from the collective's base: after the
// first pipeSlots-1 in events, the i-th event (from 1) of round c is
// pipeSlots-1 + step*c + i, its events being in(c+pipeSlots-1), red(c)
// and out(c) (out: a step of 3 only).
func (l *pipeSched) ev(c, i int) uint32 { return uint32(pipeSlots - 1 + l.step*c + i) }
func (l *pipeSched) evIn(c int) uint32 {
	if c < pipeSlots-1 {
		return uint32(c + 1)
	}
	return l.ev(c-pipeSlots+1, 1)
}
func (l *pipeSched) evRed(c int) uint32 { return l.ev(c, 2) }
func (l *pipeSched) evOut(c int) uint32 { return l.ev(c, 3) }

// events is how far the collective moves every rank's progress word.
func (l *pipeSched) events() uint32 { return uint32(pipeSlots - 1 + l.step*l.k) }

// pipeProg is where a pipelined collective moves this rank's progress
// word and waits for the others'.
type pipeProg struct {
	g     *shmGroup
	base  uint32 // the word before the collective's first event
	phase uint32 // the data phase: a wait fails on a peer that aborted before it
}

// startPipe counts the events of the pipelined collective of schedule l
// (the group's word moves by as many in every collective on every rank,
// whether this rank has data or not) and returns where they go.
func (s *shmRun) startPipe(l *pipeSched) pipeProg {
	p := pipeProg{g: s.g, base: s.g.prog, phase: s.base + 3}
	s.g.prog += l.events()
	return p
}

// set moves this rank's progress word to event ev.
func (p pipeProg) set(ev uint32) { p.g.setProg(p.base + ev) }

// wait waits for every other rank's progress word to reach event ev.
func (p pipeProg) wait(ctx context.Context, ev uint32) error {
	return p.g.waitProgAll(ctx, p.base+ev, p.phase)
}

// areas returns the first size bytes of every rank's data file of this
// collective's set (this rank's own among them).
func (s *shmRun) areas(size int) ([][]byte, error) {
	areas := make([][]byte, s.c.size)
	for r := range areas {
		var err error
		if areas[r], err = s.g.peerData(r, s.set, size); err != nil {
			return nil, err
		}
	}
	return areas, nil
}

// pipeLayout is how a pipelined reduction of numel elements of esize
// bytes on n ranks is cut.
type pipeLayout struct {
	pipeSched
	n, es int
	numel int // elements of the tensor
	per   int // elements of a chunk (the last may have fewer)
	slots int // slots in use: pipeSlots, or k when fewer
}

func newPipeLayout(numel, n, es int) pipeLayout {
	per := n * max(pipeShare/es, 1)
	k := (numel + per - 1) / per
	return pipeLayout{
		pipeSched: pipeSched{step: 3, k: k, slotLen: per * es},
		n:         n, es: es, numel: numel, per: per, slots: min(pipeSlots, k),
	}
}

// area is the bytes of a rank's data file the reduction uses.
func (l *pipeLayout) area() int { return l.slots * l.slotLen }

// chunk returns chunk c's first byte in the tensor and the byte offsets,
// within the chunk, of the ranks' shares (n+1 of them).
func (l *pipeLayout) chunk(c int) (int, []int) {
	lo := c * l.per
	sh := scale(chunks(min(l.per, l.numel-lo), l.n), l.es)
	return lo * l.es, sh
}

// publishPipe sizes this rank's data file for a pipelined reduction and
// copies in its first pipeSlots-1 chunks; the rest moves in the data
// phase, chunk by chunk. A rank whose tensors are shared buffers as the
// in-place path wants them (deferredPipe) copies none: every rank's may be,
// and then that path runs and no chunk is read; if not, it copies them in
// when the data phase starts (shmPipeReduce).
func publishPipe(s *shmPub) error {
	es := max(s.d.dtype.Size(), 1)
	l := newPipeLayout(len(s.in)/es, s.c.size, es)
	area, err := s.c.shm.publish(s.set, l.area())
	if err != nil {
		return err
	}
	if s.c.shm.deferredPipe(s.set, s.d.kind, s.d.root) {
		return nil
	}
	for c := range min(pipeSlots-1, l.k) {
		l.copyIn(area, s.in, s.c.rank, c)
	}
	return nil
}

// copyIn copies chunk c of rank me's input in, all but its own share, into
// the chunk's slot of its area.
func (l *pipeLayout) copyIn(area, in []byte, me, c int) {
	lo, sh := l.chunk(c)
	slot := l.slot(area, c)
	copy(slot[:sh[me]], in[lo:lo+sh[me]])
	copy(slot[sh[me+1]:sh[l.n]], in[lo+sh[me+1]:lo+sh[l.n]])
}

// shmPipeReduce is the data phase of a pipelined reduction (above).
func shmPipeReduce(ctx context.Context, s *shmRun) error {
	p, in, out := s.p, s.in, s.out
	me, n := s.c.rank, s.c.size
	l := newPipeLayout(numel(p.shapes[me]), n, p.esize)
	prog := s.startPipe(&l.pipeSched)
	copies := p.kind == kindAllreduce || me == p.root
	if !copies {
		// Reduce's zeros off the root, once the input (which may be
		// out) is no longer read.
		defer clear(out)
	}
	if l.k == 0 {
		return nil
	}
	areas, err := s.areas(l.area())
	if err != nil {
		return err
	}
	mine := areas[me]
	// The first pipeSlots-1 chunks: in with the publish, or now for a
	// rank that deferred them; each rank says so, and every rank waits
	// for every rank's before it reads them (in the loop).
	first := min(pipeSlots-1, l.k)
	if s.g.deferredPipe(s.set, p.kind, p.root) {
		for c := range first {
			l.copyIn(mine, in, me, c)
		}
	}
	for c := range first {
		prog.set(l.evIn(c))
	}
	srcs := make([][]byte, n)
	for c := range l.k {
		if j := c + pipeSlots - 1; j < l.k {
			if c >= 1 {
				// Slot j's last chunk was c-1.
				if err := prog.wait(ctx, l.evOut(c-1)); err != nil {
					return err
				}
			}
			l.copyIn(mine, in, me, j)
			prog.set(l.evIn(j))
		}
		if err := prog.wait(ctx, l.evIn(c)); err != nil {
			return err
		}
		lo, sh := l.chunk(c)
		a, b := sh[me], sh[me+1]
		for r := range n {
			if r == me {
				srcs[r] = in[lo+a : lo+b]
			} else {
				srcs[r] = l.slot(areas[r], c)[a:b]
			}
		}
		reduceN(p.op, p.dt, l.slot(mine, c)[a:b], srcs)
		prog.set(l.evRed(c))
		if err := prog.wait(ctx, l.evRed(c)); err != nil {
			return err
		}
		if copies {
			for r := range n {
				copy(out[lo+sh[r]:lo+sh[r+1]], l.slot(areas[r], c)[sh[r]:sh[r+1]])
			}
		}
		prog.set(l.evOut(c))
	}
	return nil
}
