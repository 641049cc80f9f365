package loader

import (
	"github.com/tensorwire/tensorwire/tensordict"
)

// share is a data-parallel rank's share of an epoch of n samples
// (Options.Rank, Options.WorldSize), as PyTorch's DistributedSampler
// splits it without shuffling the order it is given (the producer's):
// the epoch's positions padded to a multiple of the world size with its
// first positions again (pad[i], in order, wrapping round for a world
// larger than the epoch), and of those rank, rank + world, rank + 2 ×
// world... Every rank has ceil(n / world) samples; together the ranks see
// each sample of the epoch once, but for the padding's, which one rank
// sees again at the end of its share.
type share struct {
	rank, world, n int
	pad            []int // the epoch positions of this rank's padded samples, which end its share
}

// newShare returns rank's share of epochs of n samples among world ranks,
// or nil for the whole epoch (world <= 1).
func newShare(rank, world, n int) *share {
	if world <= 1 || n < 1 {
		return nil
	}
	sh := &share{rank: rank, world: world, n: n}
	total := (n + world - 1) / world * world
	for p := n; p < total; p++ {
		if p%world == rank {
			sh.pad = append(sh.pad, (p-n)%n)
		}
	}
	return sh
}

// samples returns the samples of the share: ceil(n / world).
func (sh *share) samples() int { return (sh.n + sh.world - 1) / sh.world }

// own appends to sel the offsets, in a batch whose first row is the
// epoch's position first and that has rows rows, of the rows of the share
// proper (not padding), in order.
func (sh *share) own(sel []int, first, rows int) []int {
	for o := ((sh.rank-first)%sh.world + sh.world) % sh.world; o < rows; o += sh.world {
		sel = append(sel, o)
	}
	return sel
}

// copySel copies the rows at offsets sel of the batch a announces into dst
// from row pos on: from rows, the batch's bytes, or from the ring, then
// checking the slot's word as copyRows does.
func (s *session) copySel(dst *batchBuf, pos int, a announcement, rows *tensordict.TensorDict, sel []int) error {
	if len(sel) == 0 {
		return nil
	}
	if rows != nil {
		for i, f := range s.schema {
			t, err := rows.Tensor(f.Key...)
			if err != nil {
				return err
			}
			src, err := t.Bytes()
			if err != nil {
				return err
			}
			rb := dst.rb[i]
			for j, o := range sel {
				copy(dst.leaves[i][(pos+j)*rb:(pos+j+1)*rb], src[o*rb:(o+1)*rb])
			}
		}
		return nil
	}
	r := s.reader
	for i, l := range r.leaves {
		rb := dst.rb[i]
		for j, o := range sel {
			at := l.off + int64(a.Slot*r.batch+o)*int64(rb)
			if _, err := l.mm.ReadAt(dst.leaves[i][(pos+j)*rb:(pos+j+1)*rb], at); err != nil {
				return err
			}
		}
	}
	return r.unchanged(a, "it was read")
}
