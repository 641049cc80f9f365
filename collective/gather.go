package collective

import "context"

// Gather and Allgather: the root (Gather) or every rank (Allgather) gets
// every rank's tensor, concatenated along the axis in rank order.

const (
	kindGather    kind = 4
	kindAllgather kind = 5
)

func gatherShape(p *plan, r int) []int {
	if r != p.root {
		return nil
	}
	return allgatherShape(p, r)
}

func allgatherShape(p *plan, r int) []int { return along(p.shapes[r], p.axis, sum(p.sizes)) }

// publishGather publishes every input but the root's, which only the root
// reads.
func publishGather(s *shmPub) error {
	if s.c.rank == s.d.root {
		return nil
	}
	return s.all()
}

// shmGather copies every rank's mapping into place.
func shmGather(_ context.Context, s *shmRun) error {
	p, out := s.p, s.out
	if out == nil {
		return nil
	}
	oshape := p.outShape(s.c.rank)
	pre := prefix(p.sizes)
	for r := range s.c.size {
		b, err := s.src(r)
		if err != nil {
			return err
		}
		boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), b, p.shapes[r], zeros(len(oshape)), p.shapes[r], p.esize)
	}
	return nil
}

// tcpGather stages every rank's tensor as a block, gathers the blocks
// around the ring (Allgather) or at the root (Gather), and puts them in
// place.
func tcpGather(x *xfer, p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	blocks := make([]int, n+1)
	for r := range n {
		blocks[r+1] = blocks[r] + p.bytes(r)
	}
	stage := make([]byte, blocks[n])
	copy(stage[blocks[me]:], in)
	var err error
	if p.kind == kindAllgather {
		err = x.ringAllgather(stage, blocks)
	} else {
		err = x.gatherBlocks(p.root, stage, blocks, stage)
	}
	if err != nil || out == nil {
		return err
	}
	oshape := p.outShape(me)
	pre := prefix(p.sizes)
	for r := range n {
		boxCopy(out, oshape, at(len(oshape), p.axis, pre[r]), stage[blocks[r]:blocks[r+1]], p.shapes[r], zeros(len(oshape)), p.shapes[r], es)
	}
	return nil
}
