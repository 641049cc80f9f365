package collective

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/tensorwire/tensorwire/memmap"
)

// Collectives through shared mappings (shm_linux.go has the mechanism).
// Collective number seq uses file set seq&1 and moves every rank's phase
// from 3*seq to 3*seq+3:
//
//	3seq+1  published: the description and the data are in place
//	3seq+2  reduced: the rank's data phase is over, it reads no other
//	        rank's input any more (a rank whose input others read in its
//	        shared buffer waits for every rank's before it returns:
//	        shm_shared_linux.go; the pipelined reduction counts its chunks
//	        on the progress word, shm_pipe.go)
//	3seq+3  done: the rank no longer reads the others' files of this set

// smallShm is the size up to which every rank reduces a whole Allreduce
// itself: n times the reads, one wait fewer.
const smallShm = 64 << 10

// chunks returns the element offsets of an even split of n elements in k.
func chunks(n, k int) []int { return prefix(evenCounts(n, k)) }

// shmCollective runs cl through the shared mappings, under a fault guard:
// a file of the session truncated under its mapping (by hand, or by a rank
// gone wrong) fails the collective and breaks the communicator, as any
// error in a data phase does, instead of killing the process.
func (c *Comm) shmCollective(ctx context.Context, seq uint64, cl *call) (p *plan, out []byte, err error) {
	fault := memmap.Guard(func() error {
		p, out, err = c.shmSteps(ctx, seq, cl)
		return nil
	})
	if fault == nil {
		return p, out, err
	}
	err = ownErr(fmt.Errorf("collective %d through the shared mappings: %w", seq, fault))
	// failData writes our control words (abort), which may be what
	// faulted: then the communicator is failed without them.
	cause := err
	if memmap.Guard(func() error { err = c.failData(ctx, cause); return nil }) != nil {
		c.fail(cause)
		err = cause
	}
	return nil, nil, err
}

// shmSteps is shmCollective's work.
func (c *Comm) shmSteps(ctx context.Context, seq uint64, cl *call) (*plan, []byte, error) {
	g := c.shm
	set := int(seq & 1)
	base := uint32(3 * seq)
	me, n := c.rank, c.size
	// The files of this set were last used by collective seq-2: wait for
	// every rank to be done with it.
	if seq >= 2 {
		if err := g.waitAll(ctx, base-3); err != nil {
			return nil, nil, c.failData(ctx, err)
		}
	}
	d := &cl.d
	g.putDesc(set, d.seal())
	exposed := g.putRef(set, cl)
	if err := c.shmPublish(set, cl, exposed); err != nil {
		// Still take part, so the others learn of it.
		d.bad = fmt.Sprintf("publishing the tensor: %v", err)
		d.noSpace = errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
		g.putDesc(set, d.seal())
	}
	g.setPhase(base + 1)
	if err := g.waitAll(ctx, base+1); err != nil {
		return nil, nil, c.failData(ctx, err)
	}
	ds := make([]desc, n)
	for r := range n {
		var err error
		if ds[r], err = g.desc(r, set); err != nil {
			g.setPhase(base + 3)
			return nil, nil, c.failData(ctx, fmt.Errorf("rank %d's description: %w", r, err))
		}
	}
	p, err := check(ds)
	if err != nil {
		g.setPhase(base + 3)
		return nil, nil, err
	}
	out := cl.output(p, me)
	inPlace, err := c.shmData(ctx, g, set, base, p, cl.in, out)
	if err != nil {
		return nil, nil, c.failData(ctx, err)
	}
	// Reduced: this rank no longer reads or writes the others' tensors. A
	// rank whose tensors the others read or write where they are (its
	// input exposed, or a reduction in place) waits for them all, so that
	// its caller may use them once the call returns.
	g.setPhase(base + 2)
	if exposed || inPlace {
		if err := g.waitAll(ctx, base+2); err != nil {
			return nil, nil, c.failData(ctx, err)
		}
	}
	if inPlace && p.kind == kindReduce && me != p.root {
		clear(out) // a Reduce's zeros off the root, as on the other paths, once no rank reads its input
	}
	g.setPhase(base + 3)
	return p, out, nil
}

// shmPublish copies what others will read of this rank's input into its
// data file, as the collective's publish says.
func (c *Comm) shmPublish(set int, cl *call, exposed bool) error {
	d := &cl.d
	if d.bad != "" || !d.hasT {
		return nil
	}
	o := operationOf(d.kind)
	if o == nil || o.publish == nil {
		return nil
	}
	return o.publish(&shmPub{c: c, set: set, d: d, in: cl.in, exposed: exposed})
}

// shmPub is one rank publishing its input.
type shmPub struct {
	c   *Comm
	set int
	d   *desc
	in  []byte
	// exposed: the others read the input in its shared buffer (putRef),
	// and all publishes nothing.
	exposed bool
}

// all publishes the whole input.
func (s *shmPub) all() error {
	if s.exposed {
		return nil
	}
	buf, err := s.c.shm.publish(s.set, len(s.in))
	if err != nil {
		return err
	}
	copy(buf, s.in)
	return nil
}

// What more than one collective publishes.

// publishAll publishes every rank's whole input.
func publishAll(s *shmPub) error { return s.all() }

// publishRoot publishes the root's whole input.
func publishRoot(s *shmPub) error {
	if s.c.rank != s.d.root {
		return nil
	}
	return s.all()
}

// shmData moves the data of plan p, as the collective's shm says, or, for
// an Allreduce, Reduce or ReduceScatter above smallShm whose tensors are
// shared buffers on every rank, where they are (shm_shared_linux.go):
// inPlace then, and the caller waits for every rank's reduced phase.
func (c *Comm) shmData(ctx context.Context, g *shmGroup, set int, base uint32, p *plan, in, out []byte) (inPlace bool, err error) {
	s := &shmRun{c: c, g: g, set: set, base: base, p: p, in: in, out: out}
	if p.bytes(c.rank) > smallShm {
		switch p.kind {
		case kindAllreduce:
			if rs, ok := g.refs(set, func(int) uint64 { return refIn | refOut }); ok {
				return true, s.sharedReduce(rs, -1)
			}
		case kindReduce:
			if rs, ok := g.refs(set, func(r int) uint64 {
				if r == p.root {
					return refIn | refOut
				}
				return refIn
			}); ok {
				return true, s.sharedReduce(rs, p.root)
			}
		case kindReduceScatter:
			if rs, ok := g.refs(set, func(int) uint64 { return refIn }); ok {
				return true, s.sharedReduceScatter(rs)
			}
		}
	}
	return false, p.o.shm(ctx, s)
}

// shmRun is the data phase of one collective through the shared mappings.
type shmRun struct {
	c       *Comm
	g       *shmGroup
	set     int
	base    uint32
	p       *plan
	in, out []byte
}

// src returns rank r's input as this rank sees it.
func (s *shmRun) src(r int) ([]byte, error) {
	if r == s.c.rank {
		return s.in, nil
	}
	if b, ok, err := s.g.exposedInput(r, s.set, s.p.bytes(r)); ok {
		if testSharedRead != nil {
			testSharedRead(s.c.rank)
		}
		return b, err
	}
	return s.g.peerData(r, s.set, s.p.bytes(r))
}

// srcs returns every rank's input.
func (s *shmRun) srcs() ([][]byte, error) {
	bufs := make([][]byte, s.c.size)
	for r := range bufs {
		b, err := s.src(r)
		if err != nil {
			return nil, err
		}
		bufs[r] = b
	}
	return bufs, nil
}

// testSharedRead, when set (tests), runs before a rank reads another's
// input in its shared buffer (exposed, or a reduction in place): a slow
// reader, on demand.
var testSharedRead func(rank int)

// shmNothing moves no data (Barrier).
func shmNothing(context.Context, *shmRun) error { return nil }

// sameMem reports whether a and b start at the same byte.
func sameMem(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}
