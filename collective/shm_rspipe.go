package collective

import (
	"context"
	"sort"
)

// The pipelined ReduceScatter through shared mappings, after the
// pipelined reduction (shm_pipe.go): rank r's output is block r of the
// reduction (the pieces along the axis), and chunk c is, of every block,
// its bytes [c*S, (c+1)*S) (S: share bytes, at most pipeShare). For each
// chunk every rank
//
//	in(c)   copies chunk c of every other rank's block of its input into
//	        slot c mod pipeSlots of its data file (n regions of S bytes,
//	        region r for block r);
//	red(c)  once every rank copied chunk c in, reduces chunk c of its own
//	        block, reading region r of the others' slots in place and its
//	        own block from its input, in rank order, straight into its
//	        output.
//
// Before copying chunk c+pipeSlots-1 into the slot chunk c-1 used, a rank
// waits for every rank's red(c-1), the last read of it. Its events go in
// one order, in(0) .. in(pipeSlots-2), then for each chunk c:
// in(c+pipeSlots-1) (if there is such a chunk) and red(c), numbered on the
// progress word as the reduction's are (pipeSched, a step of 2). The data
// file holds pipeSlots x n x S bytes, not the tensor; what is copied in is
// read back while still in the caches.

// pipelinedRS reports whether a ReduceScatter of bytes of input per rank
// is pipelined.
func pipelinedRS(bytes int) bool { return bytes > smallShm }

// rsShare returns the share bytes S of a pipelined ReduceScatter of bytes
// of input per rank of esize-byte elements on n ranks: about a block, up
// to pipeShare, a whole number of elements.
func rsShare(bytes, n, es int) int {
	s := (bytes/n + es - 1) / es * es
	return max(es, min(s, pipeShare/es*es))
}

// rsArea is the bytes of a rank's data file a pipelined ReduceScatter
// uses.
func rsArea(bytes, n, es int) int { return pipeSlots * n * rsShare(bytes, n, es) }

// publishRSPipe sizes this rank's data file for a pipelined ReduceScatter
// (the data moves in the data phase), or publishes the whole input of a
// small one.
func publishRSPipe(s *shmPub) error {
	if !pipelinedRS(len(s.in)) {
		return s.all()
	}
	_, err := s.c.shm.publish(s.set, rsArea(len(s.in), s.c.size, max(s.d.dtype.Size(), 1)))
	return err
}

// rsRun is a contiguous run of a block: out is its offset in the block,
// in in the input, n its bytes.
type rsRun struct{ out, in, n int }

// shmRSPipe is the data phase of a pipelined ReduceScatter (above).
func shmRSPipe(ctx context.Context, s *shmRun) error {
	p, in, out := s.p, s.in, s.out
	me, n, es := s.c.rank, s.c.size, p.esize
	shape := p.shapes[me]
	bytes := p.bytes(me)
	S := rsShare(bytes, n, es)
	pre := prefix(p.counts)
	runs := make([][]rsRun, n)
	blk := make([]int, n)
	k := 0
	for r := range n {
		box := along(shape, p.axis, p.counts[r])
		off := at(len(shape), p.axis, pre[r])
		boxRuns([][]int{box, shape}, [][]int{zeros(len(box)), off}, box, es, func(a []int, m int) {
			runs[r] = append(runs[r], rsRun{a[0], a[1], m})
		})
		blk[r] = numel(box) * es
		k = max(k, (blk[r]+S-1)/S)
	}
	l := pipeSched{step: 2, k: k, slotLen: n * S}
	prog := s.startPipe(&l)
	if k == 0 {
		return nil
	}
	areas, err := s.areas(rsArea(bytes, n, es))
	if err != nil {
		return err
	}
	// pieces calls fn for each part of block r's runs within its bytes
	// [lo, hi): its offset in the block, in the input, and its bytes.
	pieces := func(r, lo, hi int, fn func(o, i, m int)) {
		rs := runs[r]
		j := sort.Search(len(rs), func(j int) bool { return rs[j].out+rs[j].n > lo })
		for ; j < len(rs) && rs[j].out < hi; j++ {
			a, b := max(rs[j].out, lo), min(rs[j].out+rs[j].n, hi)
			fn(a, rs[j].in+a-rs[j].out, b-a)
		}
	}
	copyIn := func(c int) {
		sl := l.slot(areas[me], c)
		for r := range n {
			if r == me {
				continue
			}
			lo, hi := c*S, min((c+1)*S, blk[r])
			dst := sl[r*S:]
			pieces(r, lo, hi, func(o, i, m int) { copy(dst[o-lo:o-lo+m], in[i:i+m]) })
		}
		prog.set(l.evIn(c))
	}
	for c := range min(pipeSlots-1, k) {
		copyIn(c)
	}
	srcs := make([][]byte, n)
	for c := range k {
		if j := c + pipeSlots - 1; j < k {
			if c >= 1 {
				// Slot j's last chunk was c-1.
				if err := prog.wait(ctx, l.evRed(c-1)); err != nil {
					return err
				}
			}
			copyIn(j)
		}
		if err := prog.wait(ctx, l.evIn(c)); err != nil {
			return err
		}
		lo, hi := c*S, min((c+1)*S, blk[me])
		pieces(me, lo, hi, func(o, i, m int) {
			for r := range n {
				if r == me {
					srcs[r] = in[i : i+m]
				} else {
					srcs[r] = l.slot(areas[r], c)[me*S+o-lo : me*S+o-lo+m]
				}
			}
			reduceN(p.op, p.dt, out[o:o+m], srcs)
		})
		prog.set(l.evRed(c))
	}
	return nil
}
