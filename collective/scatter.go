package collective

import "context"

// Scatter: rank r gets piece r (along the axis) of the root's tensor.

const kindScatter kind = 6

func scatterShape(p *plan, r int) []int { return along(p.shapes[p.root], p.axis, p.counts[r]) }

// shmScatter copies this rank's piece of the root's mapping.
func shmScatter(_ context.Context, s *shmRun) error {
	p := s.p
	b, err := s.src(p.root)
	if err != nil {
		return err
	}
	oshape := p.outShape(s.c.rank)
	boxCopy(s.out, oshape, zeros(len(oshape)), b, p.shapes[p.root], at(len(oshape), p.axis, prefix(p.counts)[s.c.rank]), oshape, p.esize)
	return nil
}
