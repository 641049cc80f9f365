package collective

import (
	"context"
	"sync"
)

// The direct Allreduce over TCP, for a few ranks: rank r owns block r of
// the tensor; every rank sends block r of its input to rank r (a
// reduce-scatter in one step), and each rank sends its reduced block to
// every other (an allgather in one step). Each rank sends and receives
// 2(n-1)/n of the tensor, as in the ring, but in two steps instead of
// 2(n-1), and both steps overlap piece by piece: a piece of the reduced
// block leaves as soon as the last rank's piece is folded in. With many
// ranks the blocks get small and a rank holds connections to every other,
// so above directMax ranks Allreduce takes the ring.

// directMax is the most ranks the direct Allreduce is used for.
var directMax = 8 // a variable for the tests, which run the ring with few ranks

// directInflight is how many pieces a rank has on the wire to one peer at
// once in each of the two steps: together fewer than the side connections
// an rpc client opens to one node (8).
const directInflight = 3

// direct is the direct Allreduce of in into out (which may be in) with
// op; blocks are the ranks' blocks, in bytes. Rank r folds the pieces of
// block r in a fixed order, its own first, then rank r+1's, r+2's and so
// on around (a piece that arrives early waits for its turn), so the
// result is the same bits on every rank and in every run.
func (x *xfer) direct(p *plan, in, out []byte, blocks []int) error {
	me, n := x.c.rank, x.c.size
	blk := func(b []byte, r int) []byte { return b[blocks[r]:blocks[r+1]] }
	mine, own := blk(out, me), blk(in, me)
	if n == 1 {
		if !sameMem(out, in) {
			copy(out, in)
		}
		return nil
	}
	stepRS, stepAG := x.step, x.step+1
	x.step += 2
	ctx, cancel := context.WithCancelCause(x.ctx)
	defer cancel(nil)

	// turn[j][t] is closed once piece j of our block holds the fold of
	// t ranks (ours first): rank (me+t)%n folds its piece j in then.
	pieceOf := func(b []byte) (int, int) {
		ps := ringPiece(len(b))
		return ps, max(1, (len(b)+ps-1)/ps)
	}
	mps, mnp := pieceOf(mine)
	turn := make([][]chan struct{}, mnp)
	for j := range turn {
		turn[j] = make([]chan struct{}, n+1)
		for t := range turn[j] {
			turn[j][t] = make(chan struct{})
		}
		close(turn[j][0])
		close(turn[j][1]) // our own part is first
	}
	type posted struct {
		k msgKey
		s *slot
	}
	var recvs []posted
	for t := 1; t < n; t++ {
		r := (me + t) % n
		for j := range mnp {
			lo, hi := j*mps, min(len(mine), (j+1)*mps)
			dst, acc := mine[lo:hi], mine[lo:hi]
			if t == 1 {
				acc = own[lo:hi] // our input where it is: no copy into out first
			}
			k := x.key(r, stepRS)
			k.piece = uint32(j)
			recvs = append(recvs, posted{k, x.c.box.post(k, func(b []byte) error {
				if len(b) != len(dst) {
					return ownErr(errorf(ErrMismatch, "rank %d sent %d bytes, rank %d expected %d", r, len(b), me, len(dst)))
				}
				select {
				case <-turn[j][t]:
				case <-ctx.Done():
					return x.c.gaveUp(context.Cause(ctx))
				}
				reduceN(p.op, p.dt, dst, [][]byte{acc, b})
				close(turn[j][t+1])
				return nil
			})})
		}
	}
	for r := range n {
		if r == me {
			continue
		}
		b := blk(out, r)
		ps, np := pieceOf(b)
		for j := range np {
			k := x.key(r, stepAG)
			k.piece = uint32(j)
			dst := b[j*ps : min(len(b), (j+1)*ps)]
			recvs = append(recvs, posted{k, x.c.box.post(k, func(m []byte) error {
				if len(m) != len(dst) {
					return ownErr(errorf(ErrMismatch, "rank %d sent %d bytes, rank %d expected %d", r, len(m), me, len(dst)))
				}
				copy(dst, m)
				return nil
			})})
		}
	}

	fe := &firstError{cancel: cancel}
	var wg sync.WaitGroup
	// sendAll sends the pieces of b to rank to, at most directInflight at
	// once, each once ready(j) says so.
	sendAll := func(to int, step uint32, b []byte, ready func(j int) <-chan struct{}) {
		ps, np := pieceOf(b)
		sem := make(chan struct{}, directInflight)
		for j := range np {
			if ready != nil {
				select {
				case <-ready(j):
				case <-ctx.Done():
					return
				}
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			k := x.key(me, step)
			k.piece = uint32(j)
			part := b[j*ps : min(len(b), (j+1)*ps)]
			wg.Go(func() {
				defer func() { <-sem }()
				if err := x.c.send(ctx, to, k, part); err != nil {
					fe.set(err)
				}
			})
		}
	}
	for d := 1; d < n; d++ {
		to := (me + d) % n
		wg.Go(func() { sendAll(to, stepRS, blk(in, to), nil) })
		wg.Go(func() {
			sendAll(to, stepAG, mine, func(j int) <-chan struct{} { return turn[j][n] })
		})
	}
	for _, r := range recvs {
		if err := x.c.box.wait(ctx, r.k, r.s); err != nil {
			fe.set(err)
		}
	}
	wg.Wait()
	return fe.get()
}
