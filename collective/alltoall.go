package collective

import "context"

// Alltoall: rank r gets piece r (along the scatter axis) of every rank's
// tensor, concatenated along the gather axis in rank order.

const kindAlltoall kind = 7

func alltoallShape(p *plan, r int) []int {
	s := along(p.shapes[r], p.axis2, p.counts[r])
	s[p.axis] = sum(p.sizes)
	return s
}

// shmAlltoall copies this rank's piece of every rank's mapping into place.
func shmAlltoall(_ context.Context, s *shmRun) error {
	p, me := s.p, s.c.rank
	oshape := p.outShape(me)
	pre, cpre := prefix(p.sizes), prefix(p.counts)
	for r := range s.c.size {
		b, err := s.src(r)
		if err != nil {
			return err
		}
		box := along(p.shapes[r], p.axis2, p.counts[me])
		boxCopy(s.out, oshape, at(len(oshape), p.axis, pre[r]), b, p.shapes[r], at(len(oshape), p.axis2, cpre[me]), box, p.esize)
	}
	return nil
}
