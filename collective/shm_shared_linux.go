//go:build linux

package collective

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/tensorwire/tensorwire/internal/shm"
)

// Shared buffers through the session's folder (shared.go has the API).
// A rank's shared buffers are files rank-R.s<i> of the folder, i counting
// from 0 and never reused: a file Alloc made, or a hard link to a file
// Register was given. For each file set, the rank's control file says
// where its input and output are when both are in shared buffers (the
// reference words, ctlRef), written before the published phase and read
// by the others after it: the words of set i are next written by
// collective seq+2, which starts only once every rank is done with seq.

// The reference words of file set i, at ctlRef + 64*i: five uint64.
const (
	ctlRef    = 512
	refBits   = 0  // what the words below say (refIn, refOut, refExposed)
	refInIdx  = 8  // the input's file, s<idx>
	refInOff  = 16 // its first byte in the file
	refOutIdx = 24 // the output's file
	refOutOff = 32 // its first byte
)

// sharedFile is one of this rank's shared buffers.
type sharedFile struct {
	idx  uint32
	path string   // Register's path; "" for Alloc's
	m    *shm.Map // Alloc's mapping; nil for Register's
	mem  []byte   // the bytes the file is mapped at here
}

// sharedSet is a rank's shared buffers and its mappings of the others'.
type sharedSet struct {
	mu    sync.Mutex
	next  uint32
	own   []*sharedFile
	peers []map[uint32]*shm.Map // guarded by the communicator's opMu (collectives only)
	// retired are mappings of the others' files replaced (a file grew)
	// or let go of (a file freed) during a collective, which may still
	// read through them: unmapped when the next collective starts
	// (putRef). Guarded by opMu as peers.
	retired []*shm.Map
}

// sharedRef is where a rank's tensors of a collective are.
type sharedRef struct {
	inIdx, outIdx uint32
	inOff, outOff int
}

// alloc makes a shared buffer of n bytes and returns its bytes.
func (g *shmGroup) alloc(n int) ([]byte, error) {
	g.sh.mu.Lock()
	defer g.sh.mu.Unlock()
	idx := g.sh.next
	size := (max(n, 1) + 4095) &^ 4095
	m, err := shm.Create(sharedPath(g.dir, g.me, idx), size, 0o600)
	if err != nil {
		return nil, err
	}
	g.sh.next++
	f := &sharedFile{idx: idx, m: m, mem: m.Bytes()[:n:n]}
	g.sh.own = append(g.sh.own, f)
	return f.mem, nil
}

// free releases Alloc's buffer starting at b.
func (g *shmGroup) free(b []byte) error {
	g.sh.mu.Lock()
	defer g.sh.mu.Unlock()
	for i, f := range g.sh.own {
		if f.m != nil && sameMem(f.mem, b) {
			g.sh.own = append(g.sh.own[:i], g.sh.own[i+1:]...)
			os.Remove(sharedPath(g.dir, g.me, f.idx))
			return f.m.Close()
		}
	}
	return ErrNotShared
}

// register makes path, mapped at mem, a shared buffer (or maps it anew).
func (g *shmGroup) register(path string, mem []byte) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if len(mem) == 0 {
		return fmt.Errorf("%w: register %s: no bytes mapped", ErrArgument, path)
	}
	g.sh.mu.Lock()
	defer g.sh.mu.Unlock()
	for _, f := range g.sh.own {
		if f.path == abs {
			f.mem = mem
			return nil
		}
	}
	idx := g.sh.next
	// A hard link: the file stays reachable when its owner unlinks it, as
	// a Python rank does its data file.
	if err := os.Link(abs, sharedPath(g.dir, g.me, idx)); err != nil {
		return fmt.Errorf("collective: register %s: it must be on the file system of the shared folder %s: %w", path, g.dir, err)
	}
	g.sh.next++
	g.sh.own = append(g.sh.own, &sharedFile{idx: idx, path: abs, mem: mem})
	return nil
}

// deregister undoes register.
func (g *shmGroup) deregister(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	g.sh.mu.Lock()
	defer g.sh.mu.Unlock()
	for i, f := range g.sh.own {
		if f.m == nil && f.path == abs {
			g.sh.own = append(g.sh.own[:i], g.sh.own[i+1:]...)
			os.Remove(sharedPath(g.dir, g.me, f.idx))
			return nil
		}
	}
	return ErrNotShared
}

// locate returns the shared buffer b lies within, and b's offset there.
func (g *shmGroup) locate(b []byte) (uint32, int, bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	g.sh.mu.Lock()
	defer g.sh.mu.Unlock()
	for _, f := range g.sh.own {
		if len(f.mem) == 0 {
			continue
		}
		lo := uintptr(unsafe.Pointer(&f.mem[0]))
		if p >= lo && p-lo+uintptr(len(b)) <= uintptr(len(f.mem)) {
			return f.idx, int(p - lo), true
		}
	}
	return 0, 0, false
}

// putRef writes the reference words of set for this rank's call cl and
// returns whether its input is exposed: read by the others in its shared
// buffer instead of its data file, which the publish then skips. An input
// is exposed for the collectives whose others read it whole from the
// published tensor (Bcast, Gather, Allgather, Scatter, Alltoall) when
// nothing this rank writes overlaps it (its output does not, or is it
// unchanged: Bcast's root in place); an exposed rank then waits, before
// its call returns, for every rank to be done reading (shmSteps).
func (g *shmGroup) putRef(set int, cl *call) bool {
	for _, m := range g.sh.retired {
		m.Close()
	}
	g.sh.retired = g.sh.retired[:0]
	base := ctlRef + 64*set
	d, in, out := &cl.d, cl.in, cl.out
	bits := uint64(0)
	// A ReduceScatter in place reads every rank's input while each writes
	// its output: an output over its own input is not read in place.
	apart := d.kind != kindReduceScatter || !overlap(in, out)
	if d.bad == "" && len(in) > 0 && apart {
		if idx, off, ok := g.locate(in); ok {
			bits |= refIn
			g.word64(g.me, base+refInIdx).Store(uint64(idx))
			g.word64(g.me, base+refInOff).Store(uint64(off))
			if len(out) > 0 && (sameMem(in, out) || !overlap(in, out)) {
				if idx, off, ok := g.locate(out); ok {
					bits |= refOut
					g.word64(g.me, base+refOutIdx).Store(uint64(idx))
					g.word64(g.me, base+refOutOff).Store(uint64(off))
				}
			}
			switch d.kind {
			case kindBcast, kindGather, kindAllgather, kindScatter, kindAlltoall:
				if !overlap(in, out) || d.kind == kindBcast && sameMem(in, out) && len(out) == len(in) {
					bits |= refExposed
				}
			}
		}
	}
	g.word64(g.me, base+refBits).Store(bits)
	return bits&refExposed != 0
}

// deferredPipe reports whether this rank's tensors of the reduction of
// kind k (root: Reduce's; the others' is not looked at) in set are shared buffers as the
// in-place path wants them (its input, and its output on every rank of an
// Allreduce and on Reduce's root: putRef's words): its pipelined publish
// then leaves its first chunks for the data phase (publishPipe).
func (g *shmGroup) deferredPipe(set int, k kind, root int) bool {
	want := uint64(refIn)
	if k == kindAllreduce || (k == kindReduce && g.me == root) {
		want |= refOut
	}
	return g.word64(g.me, ctlRef+64*set+refBits).Load()&want == want
}

// refs reads every rank's reference words of set for a reduction in
// place: ok when every rank's input is a shared buffer and, as want says,
// its output.
func (g *shmGroup) refs(set int, want func(r int) uint64) ([]sharedRef, bool) {
	base := ctlRef + 64*set
	rs := make([]sharedRef, g.n)
	for r := range g.n {
		if w := want(r); g.word64(r, base+refBits).Load()&w != w {
			return nil, false
		}
		rs[r] = sharedRef{
			inIdx: uint32(g.word64(r, base+refInIdx).Load()), inOff: int(g.word64(r, base+refInOff).Load()),
			outIdx: uint32(g.word64(r, base+refOutIdx).Load()), outOff: int(g.word64(r, base+refOutOff).Load()),
		}
	}
	return rs, true
}

// exposedInput returns n bytes of rank r's input in its shared buffer when
// r exposed it for set (putRef), else ok false: read its data file.
func (g *shmGroup) exposedInput(r, set, n int) ([]byte, bool, error) {
	base := ctlRef + 64*set
	if g.word64(r, base+refBits).Load()&refExposed == 0 {
		return nil, false, nil
	}
	b, err := g.peerShared(r, uint32(g.word64(r, base+refInIdx).Load()), int(g.word64(r, base+refInOff).Load()), n)
	return b, true, err
}

// peerShared returns n bytes at off of rank r's shared buffer idx, mapping
// it (again, when it grew) as needed.
func (g *shmGroup) peerShared(r int, idx uint32, off, n int) ([]byte, error) {
	if off < 0 || n < 0 || off > 1<<50 || n > 1<<50 {
		return nil, ownErr(fmt.Errorf("rank %d's shared buffer s%d: %d bytes at %d", r, idx, n, off))
	}
	if g.sh.peers == nil {
		g.sh.peers = make([]map[uint32]*shm.Map, g.n)
	}
	if g.sh.peers[r] == nil {
		g.sh.peers[r] = map[uint32]*shm.Map{}
	}
	m := g.sh.peers[r][idx]
	if m == nil {
		// A file of r's not mapped yet: let go of the mappings of those r
		// has freed since (their pages stay while a mapping holds them).
		for i, pm := range g.sh.peers[r] {
			if _, err := os.Stat(sharedPath(g.dir, r, i)); err != nil {
				g.sh.retired = append(g.sh.retired, pm)
				delete(g.sh.peers[r], i)
			}
		}
	}
	if m == nil || m.Len() < off+n {
		path := sharedPath(g.dir, r, idx)
		fi, err := os.Stat(path)
		if err != nil {
			return nil, ownErr(fmt.Errorf("rank %d's shared buffer: %w", r, err))
		}
		if fi.Size() < int64(off+n) {
			return nil, ownErr(fmt.Errorf("rank %d's shared buffer s%d is %d bytes, %d needed", r, idx, fi.Size(), off+n))
		}
		nm, err := shm.Open(path, int(fi.Size()), true)
		if err != nil {
			return nil, ownErr(fmt.Errorf("rank %d's shared buffer: %w", r, err))
		}
		if m != nil {
			// Bytes of this call may have come through m (the same
			// file's input, read before its output past m's end).
			g.sh.retired = append(g.sh.retired, m)
		}
		m = nm
		g.sh.peers[r][idx] = m
	}
	return m.Bytes()[off : off+n : off+n], nil
}

// closeShared unmaps the others' buffers and removes this rank's files
// from the folder (Alloc's mappings stay: their tensors may outlive the
// communicator, until Free).
func (g *shmGroup) closeShared() {
	g.sh.mu.Lock()
	defer g.sh.mu.Unlock()
	for _, ms := range g.sh.peers {
		for _, m := range ms {
			m.Close()
		}
	}
	g.sh.peers = nil
	for _, m := range g.sh.retired {
		m.Close()
	}
	g.sh.retired = nil
	for _, f := range g.sh.own {
		os.Remove(sharedPath(g.dir, g.me, f.idx))
	}
}

// overlap reports whether a and b share a byte.
func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// sharedChunk is the bytes a rank reduces at a time in sharedReduce: the
// partial result stays in the core's first-level cache between the reads
// of the inputs and the writes of the outputs.
const sharedChunk = 32 << 10

// sharedReduce is the data phase of an Allreduce (root -1) whose input
// and output are shared buffers on every rank, or of a Reduce whose inputs
// and root's output are (rs: where they are). Each rank reduces its share
// of the elements (the even split chunks gives) reading every rank's input
// in place, in rank order as every other path does (the same bits), and
// writes the result into every rank's output (Reduce: the root's). A
// rank's share of an input is read only by that rank, and its share of an
// output written only by it, after it read the inputs: so an output may be
// its rank's input (in place), and the only other synchronisation is the
// wait for every rank's reduced phase that shmSteps makes after it (and
// after which a Reduce's other ranks zero their outputs). Nothing goes
// through the data files.
func (s *shmRun) sharedReduce(rs []sharedRef, root int) error {
	p, g := s.p, s.g
	me, n := s.c.rank, s.c.size
	nb := p.bytes(me)
	srcs := make([][]byte, n)
	var dsts [][]byte
	for r := range n {
		var err error
		if r == me {
			srcs[r] = s.in[:nb]
		} else if srcs[r], err = g.peerShared(r, rs[r].inIdx, rs[r].inOff, nb); err != nil {
			return err
		}
		var dst []byte
		switch {
		case root >= 0 && r != root:
			continue
		case r == me:
			dst = s.out[:nb]
		default:
			if dst, err = g.peerShared(r, rs[r].outIdx, rs[r].outOff, nb); err != nil {
				return err
			}
		}
		dsts = append(dsts, dst)
	}
	if testSharedRead != nil {
		testSharedRead(me)
	}
	es := p.esize
	sh := scale(chunks(nb/es, n), es)
	if len(g.sbuf) < sharedChunk {
		g.sbuf = make([]byte, sharedChunk)
	}
	step := sharedChunk / es * es
	sub := make([][]byte, n)
	for a := sh[me]; a < sh[me+1]; a += step {
		b := min(a+step, sh[me+1])
		for r := range n {
			sub[r] = srcs[r][a:b]
		}
		acc := g.sbuf[:b-a]
		reduceN(p.op, p.dt, acc, sub)
		for _, d := range dsts {
			copy(d[a:b], acc)
		}
	}
	g.shared.Add(1)
	return nil
}

// sharedReduceScatter is the data phase of a ReduceScatter whose inputs
// are shared buffers on every rank (none under its own output): each rank
// reduces its piece from every rank's input in place, in rank order (the
// same bits as the other paths), straight into its output; shmSteps then
// waits for every rank's reduced phase, as after sharedReduce.
func (s *shmRun) sharedReduceScatter(rs []sharedRef) error {
	p, g, out := s.p, s.g, s.out
	me, n, es := s.c.rank, s.c.size, p.esize
	nb := p.bytes(me)
	bufs := make([][]byte, n)
	for r := range n {
		var err error
		if r == me {
			bufs[r] = s.in[:nb]
		} else if bufs[r], err = g.peerShared(r, rs[r].inIdx, rs[r].inOff, nb); err != nil {
			return err
		}
	}
	if testSharedRead != nil {
		testSharedRead(me)
	}
	shape := p.shapes[me]
	box := p.outShape(me)
	off := at(len(shape), p.axis, prefix(p.counts)[me])
	srcs := make([][]byte, n)
	boxRuns([][]int{box, shape}, [][]int{zeros(len(box)), off}, box, es, func(a []int, k int) {
		for r := range n {
			srcs[r] = bufs[r][a[1] : a[1]+k]
		}
		reduceN(p.op, p.dt, out[a[0]:a[0]+k], srcs)
	})
	g.shared.Add(1)
	return nil
}
