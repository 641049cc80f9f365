package collective

import (
	"context"
	"sort"
)

// The pipelined Allgather through shared mappings, after the pipelined
// reduction (shm_pipe.go): chunk c of rank r's input is its bytes
// [c*S, (c+1)*S) (S: pipeShare, a whole number of elements; ranks' inputs
// may differ in length along the axis, and a chunk past one's end is
// empty). For each chunk every rank
//
//	in(c)   copies chunk c of its input into slot c mod pipeSlots of its
//	        data file (the first pipeSlots-1 chunks with the publish,
//	        before the published phase, which then stands for them);
//	out(c)  once every rank copied chunk c in, copies every other rank's
//	        chunk c from its slot into place in its output (its own input
//	        it copies whole, at the start).
//
// Before copying chunk c+pipeSlots-1 into the slot chunk c-1 used, a rank
// waits for every rank's out(c-1), the last read of it. The events are
// numbered on the progress word as the reduction's are: in(0) ..
// in(pipeSlots-2), then for each chunk c in(c+pipeSlots-1) (if there is
// such a chunk) and out(c). A tensor of one chunk a rank waits for nothing
// but the published phase, as the whole-tensor copy did; the data file
// holds pipeSlots chunks, not the tensor.

// agShare is the bytes S of an Allgather chunk of esize-byte elements.
func agShare(es int) int { return max(pipeShare/es, 1) * es }

// publishAGPipe sizes this rank's data file for a pipelined Allgather and
// copies in its first pipeSlots-1 chunks.
func publishAGPipe(s *shmPub) error {
	S := agShare(max(s.d.dtype.Size(), 1))
	area, err := s.c.shm.publish(s.set, pipeSlots*S)
	if err != nil {
		return err
	}
	for c := 0; c < pipeSlots-1 && c*S < len(s.in); c++ {
		copy(area[c*S:(c+1)*S], s.in[c*S:min((c+1)*S, len(s.in))])
	}
	return nil
}

// shmAGPipe is the data phase of a pipelined Allgather (above).
func shmAGPipe(ctx context.Context, s *shmRun) error {
	g, p, in, out := s.g, s.p, s.in, s.out
	me, n, es := s.c.rank, s.c.size, p.esize
	S := agShare(es)
	k := 0
	for r := range n {
		k = max(k, (p.bytes(r)+S-1)/S)
	}
	base := g.prog
	g.prog += uint32(pipeSlots - 1 + 2*k)
	oshape := p.outShape(me)
	pre := prefix(p.sizes)
	// runs[r]: where rank r's input goes in the output, as runs in the
	// order of its input: at[0] in the output, at[1] in the input.
	runs := make([][]rsRun, n)
	for r := range n {
		if r == me {
			boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), in, p.shapes[r], zeros(len(oshape)), p.shapes[r], es)
			continue
		}
		boxRuns([][]int{oshape, p.shapes[r]}, [][]int{at(len(oshape), p.axis, pre[r]), zeros(len(oshape))}, p.shapes[r], es, func(a []int, m int) {
			runs[r] = append(runs[r], rsRun{out: a[0], in: a[1], n: m})
		})
	}
	if k == 0 {
		return nil
	}
	evIn := func(c int) uint32 { return uint32(pipeSlots - 1 + 2*(c-pipeSlots+1) + 1) }
	evOut := func(c int) uint32 { return uint32(pipeSlots - 1 + 2*c + 2) }
	areas := make([][]byte, n)
	for r := range n {
		var err error
		if areas[r], err = g.peerData(r, s.set, pipeSlots*S); err != nil {
			return err
		}
	}
	wait := func(ev uint32) error { return g.waitProgAll(ctx, base+ev, s.base+3) }
	for c := range k {
		if j := c + pipeSlots - 1; j < k {
			if c >= 1 {
				// Slot j's last chunk was c-1.
				if err := wait(evOut(c - 1)); err != nil {
					return err
				}
			}
			i := j % pipeSlots
			if lo := j * S; lo < len(in) {
				copy(areas[me][i*S:(i+1)*S], in[lo:min(lo+S, len(in))])
			}
			g.setProg(base + evIn(j))
		}
		if c >= pipeSlots-1 { // the first ones came with the publish
			if err := wait(evIn(c)); err != nil {
				return err
			}
		}
		i := c % pipeSlots
		lo := c * S
		for r := range n {
			if r == me {
				continue
			}
			hi := min(lo+S, p.bytes(r))
			slot := areas[r][i*S : (i+1)*S]
			rs := runs[r]
			j := sort.Search(len(rs), func(j int) bool { return rs[j].in+rs[j].n > lo })
			for ; j < len(rs) && rs[j].in < hi; j++ {
				a, b := max(rs[j].in, lo), min(rs[j].in+rs[j].n, hi)
				o := rs[j].out + a - rs[j].in
				copy(out[o:o+b-a], slot[a-lo:b-lo])
			}
		}
		g.setProg(base + evOut(c))
	}
	return nil
}
