package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/memmap"
)

// Point-to-point by reference (docs/collective.md, "Point-to-point
// through the mapping"). Between two ranks that share a folder (a shared-
// mapping communicator, or host-mates of a hierarchical one) a message of
// at least Config.ShmSendMin bytes does not carry its bytes: the sender
// copies the tensor into a region of its own p2p file in that folder and
// sends one small collective.msg with the dtype and shape and a reference
// (p2pRef); the receiver's handler copies the region into the posted
// tensor and answers, and the sender frees the region.
//
// A sender's p2p file is an arena, p2p-<rank>-<gen> (gen counting the
// arenas it made), reused from message to message so that its pages stay
// reserved and mapped on both sides (a file per message would cost a
// create, a fallocate, two mappings and a page fault per 4 KiB on each
// side, every time). Regions are handed out first-fit and freed in any
// order, so many messages may be in flight. When none fits, the sender
// makes a larger arena (the next generation) and retires the old one,
// removed once its last region is freed; an arena at least shrinkRatio
// times larger than each of the last shrinkAfter messages is replaced,
// by the first message that finds it idle, with one sized for that
// message, so that one large tensor sent does not hold its pages (tmpfs:
// memory) until Close. A receiver maps each
// generation once and unmaps an older one when it is idle. A region starts with a
// 64-byte header whose first word is the message's state: id<<2 | state,
// state 0 ready, 1 the receiver reading, 2 read, 3 withdrawn by the
// sender; its second, the fill word, counts the chunks (refChunk bytes)
// the sender has copied in. A message of several chunks is pipelined: its
// reference goes before the sender copies, and the receiver copies chunk
// i out once the fill word passes i (waiting on it as on a phase: a spin,
// then a futex), while the sender copies chunk i+1 in, so the two copies
// overlap rather than follow each other. The receiver claims it (0 to 1) before reading and marks it read
// after; a sender whose call failed (its context ended, the receiver is
// lost) withdraws it (0 to 3) before freeing it, or, when the receiver is
// reading, frees it once the receiver is done, so a region is never
// reused under a reader, and a message delivered late finds its id gone
// rather than another message's bytes.

// Message states in a region's header word.
const (
	refReady = iota
	refReading
	refRead
	refWithdrawn
)

const (
	// ShmSendMinDefault is Config.ShmSendMin's default where this rank
	// has no inbox (p2p_inbox.go): a page. A message by reference was
	// faster than inline at every size measured, 64 B up
	// (docs/benchmarks.md), mostly because an inline message is two rpc
	// round trips (its dtype and shape, then its bytes) and one by
	// reference one; without an inbox, messages under a page stay inline
	// all the same, off the shared folder (a region is at least two
	// pages). With inboxes every message goes by reference.
	ShmSendMinDefault = 4 << 10

	refHeader   = 64      // a region's header, before its bytes
	refFill     = 8       // the fill word's offset in the header
	refChunk    = 1 << 20 // the pipeline's step
	fillFailed  = ^uint32(0)
	refAlign    = 4096    // regions are whole pages
	arenaMin    = 4 << 20 // the smallest arena
	arenaMax    = 1 << 30 // the largest: a message that needs more goes inline
	shrinkAfter = 128     // messages in a row an oversized arena serves before it goes
	shrinkRatio = 8       // an arena this many times a message's region is oversized for it
	refMaxBytes = 1 << 40 // a reference larger than this is malformed
)

// stateWord is a region's header word for message id in state st.
func stateWord(id uint64, st uint64) uint64 { return id<<2 | st }

// p2pRef is a message's reference: the region at Off of the sender's
// arena Gen (of Size bytes), holding Len bytes after its header, for the
// message numbered ID. With Buf (protocol 8), the bytes are in the
// sender's shared buffer instead, and the region is its header alone
// (Len 0): the state word as for any message, the fill word set once
// (withdrawn as fillFailed when the sender gives up while the receiver
// reads, which the receiver checks after its copy).
type p2pRef struct {
	Buf  *p2pBuf `codec:"buf,omitempty"`
	Gen  uint32  `codec:"gen"`
	ID   uint64  `codec:"id"`
	Len  uint64  `codec:"len"`
	Off  uint64  `codec:"off"`
	Size uint64  `codec:"size"`
}

// p2pBuf is where a message's bytes are in the sender's shared buffer:
// Len bytes at Off of its file rank-<src>.s<Idx> (shared.go).
type p2pBuf struct {
	Idx uint32 `codec:"idx"`
	Len uint64 `codec:"len"`
	Off uint64 `codec:"off"`
}

// arenaName is the file of rank's arena gen.
func arenaName(rank int, gen uint32) string { return fmt.Sprintf("p2p-%d-%d", rank, gen) }

// span is a free range of an arena.
type span struct{ off, n int }

// p2pArena is one of this rank's p2p files, mapped.
type p2pArena struct {
	gen     uint32
	path    string
	m       *shm.Map
	size    int
	free    []span // sorted by offset, coalesced
	live    int    // regions handed out
	dead    bool   // retired: no new regions; released with its last
	removed bool   // its file unlinked
}

// take hands out n bytes, first fit.
func (a *p2pArena) take(n int) (int, bool) {
	for i, s := range a.free {
		if s.n < n {
			continue
		}
		off := s.off
		if s.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + n, s.n - n}
		}
		a.live++
		return off, true
	}
	return 0, false
}

// give returns [off, off+n) to the free list.
func (a *p2pArena) give(off, n int) {
	a.live--
	i := 0
	for i < len(a.free) && a.free[i].off < off {
		i++
	}
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, n}
	// Coalesce with the next, then the previous.
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
}

func (a *p2pArena) unlink() {
	if !a.removed {
		a.removed = true
		os.Remove(a.path)
	}
}

// release unlinks and unmaps a; no region of it is in use.
func (a *p2pArena) release() {
	a.unlink()
	a.m.Close()
}

// p2pOut is this rank's arenas, made on its first message by reference.
type p2pOut struct {
	mu     sync.Mutex
	cur    *p2pArena
	gens   uint32
	ids    uint64
	small  int // messages in a row for which cur is oversized (shrinkRatio)
	all    map[*p2pArena]bool
	closed bool
}

// p2pRegion is a region handed out for one message.
type p2pRegion struct {
	a   *p2pArena
	off int
	n   int
	id  uint64
	b   []byte // the message's bytes in the mapping
}

// errNoRoom: no region for the message; it goes inline.
var errNoRoom = errors.New("no room for a message by reference")

// alloc returns a region of dir's arena of this rank for n bytes, making
// a new arena when none has room.
func (o *p2pOut) alloc(dir string, rank, n int) (*p2pRegion, error) {
	need := (refHeader + n + refAlign - 1) &^ (refAlign - 1)
	if need > arenaMax {
		return nil, errNoRoom
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, errNoRoom
	}
	a := o.cur
	if a != nil && !a.dead && a.size > arenaMin {
		if need*shrinkRatio <= a.size {
			o.small++
		} else {
			o.small = 0
		}
		if o.small >= shrinkAfter && a.live == 0 {
			// Oversized for the messages of late: retired (and, idle,
			// removed at once); the next arena is sized for this one.
			o.retire(a)
			a = nil
		}
	}
	off, ok := 0, false
	if a != nil && !a.dead {
		off, ok = a.take(need)
	}
	if !ok {
		// Room for two such messages (a sender streaming one at a time
		// keeps one arena), in whole MiB; twice the old one's when it
		// was full of others in flight.
		size := max(arenaMin, (2*need+1<<20-1)&^(1<<20-1))
		if a != nil && !a.dead {
			size = max(size, 2*a.size)
		}
		size = min(size, arenaMax)
		na, err := o.newArena(dir, rank, size)
		if err != nil {
			return nil, err
		}
		if a != nil {
			o.retire(a)
		}
		o.cur, a = na, na
		o.small = 0
		off, _ = a.take(need)
	}
	o.ids++
	return &p2pRegion{a: a, off: off, n: need, id: o.ids, b: a.m.Bytes()[off+refHeader : off+refHeader+n]}, nil
}

// newArena makes arena file gen+1 of size bytes, its pages reserved (a
// full folder is an error here, never a SIGBUS later).
func (o *p2pOut) newArena(dir string, rank, size int) (*p2pArena, error) {
	o.gens++
	path := filepath.Join(dir, arenaName(rank, o.gens))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := shm.Grow(f, size); err != nil {
		os.Remove(path)
		return nil, err
	}
	m, err := shm.MapFile(f, size, true)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	a := &p2pArena{gen: o.gens, path: path, m: m, size: size, free: []span{{0, size}}}
	if o.all == nil {
		o.all = map[*p2pArena]bool{}
	}
	o.all[a] = true
	return a, nil
}

// retire stops handing out regions of a; it goes with its last region.
// Called with o.mu held.
func (o *p2pOut) retire(a *p2pArena) {
	a.dead = true
	if o.cur == a {
		o.cur = nil
	}
	if a.live == 0 {
		a.release()
		delete(o.all, a)
	}
}

// free returns r's region. broken: its arena's file faulted (truncated by
// hand): the arena is unlinked at once and no longer used.
func (o *p2pOut) free(r *p2pRegion, broken bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	a := r.a
	a.give(r.off, r.n)
	if broken {
		a.unlink()
		a.dead = true
		if o.cur == a {
			o.cur = nil
		}
	}
	if (a.dead || o.closed) && a.live == 0 {
		a.release()
		delete(o.all, a)
	}
}

// close unlinks every arena (the folder goes with the last rank) and
// unmaps those with no message in flight; the others are unmapped as
// their last region is freed.
func (o *p2pOut) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.cur = nil
	for a := range o.all {
		a.dead = true
		a.unlink()
		if a.live == 0 {
			a.m.Close()
			delete(o.all, a)
		}
	}
}

// word is the region's header word.
func (r *p2pRegion) word() *shm.Uint64 { return r.a.m.Uint64(r.off) }

// fill is the region's fill word.
func (r *p2pRegion) fill() *shm.Uint32 { return r.a.m.Uint32(r.off + refFill) }

// refChunks is how many pipeline steps n bytes take.
func refChunks(n int) int { return max(1, (n+refChunk-1)/refChunk) }

func (r *p2pRegion) ref() *p2pRef {
	return &p2pRef{Gen: r.a.gen, ID: r.id, Len: uint64(len(r.b)), Off: uint64(r.off), Size: uint64(r.a.size)}
}

// settle frees r once its message's call has returned with err: at once
// when the receiver read it, or when the sender can withdraw it (the
// receiver has not claimed it), or once the receiver's read ends.
func (c *Comm) settle(r *p2pRegion, err error) {
	if err == nil {
		c.p2pOut.free(r, false)
		return
	}
	var state uint64
	fault := guardOwn(func() error {
		w := r.word()
		if w.CompareAndSwap(stateWord(r.id, refReady), stateWord(r.id, refWithdrawn)) {
			state = refWithdrawn
		} else {
			state = w.Load() & 3
		}
		return nil
	})
	if fault != nil || state != refReading {
		c.p2pOut.free(r, fault != nil)
		return
	}
	// The receiver is copying it out: free it when it is done (or this
	// communicator closes; a receiver that died leaves it reading).
	go func() {
		for pause := 50 * time.Microsecond; ; pause = min(2*pause, 5*time.Millisecond) {
			st := uint64(refReading)
			fault := guardOwn(func() error { st = r.word().Load() & 3; return nil })
			if fault != nil || st != refReading {
				c.p2pOut.free(r, fault != nil)
				return
			}
			select {
			case <-c.closing:
				c.p2pOut.free(r, false)
				return
			case <-time.After(pause):
			}
		}
	}()
}

// p2pIn is this rank's mappings of the other ranks' arenas.
type p2pIn struct {
	mu     sync.Mutex
	bufs   map[peerBufKey]*peerBuf // the others' shared buffers, for messages by a reference to them
	maps   map[peerGen]*peerArena
	latest map[int]uint32 // the newest generation seen of each rank
	closed bool
}

type peerGen struct {
	rank int
	gen  uint32
}

type peerArena struct {
	key   peerGen
	m     *shm.Map
	users int
}

// get maps rank src's arena gen of size bytes in dir (once).
func (in *p2pIn) get(dir string, src int, gen uint32, size int) (*peerArena, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, errorf(ErrClosed, "a message by reference from rank %d", src)
	}
	if in.maps == nil {
		in.maps, in.latest = map[peerGen]*peerArena{}, map[int]uint32{}
	}
	k := peerGen{src, gen}
	p := in.maps[k]
	if p == nil || p.m.Len() < size {
		// Read-write: the receiver claims and marks the region's header.
		m, err := shm.Open(filepath.Join(dir, arenaName(src, gen)), size, true)
		if err != nil {
			return nil, err
		}
		if p != nil {
			if p.users == 0 {
				p.m.Close()
			} // else it stays mapped until Close: an arena never grows, so this does not happen
		}
		p = &peerArena{key: k, m: m}
		in.maps[k] = p
	}
	if g, ok := in.latest[src]; !ok || int32(gen-g) > 0 {
		in.latest[src] = gen
		// The sender retired its older arenas: unmap those idle here
		// (a busy one goes with its last use, put).
		for k, q := range in.maps {
			if k.rank == src && k.gen != gen && q.users == 0 {
				q.m.Close()
				delete(in.maps, k)
			}
		}
	}
	p.users++
	return p, nil
}

// put ends a use of p, unmapping it when it is idle and the rank has a
// newer arena.
func (in *p2pIn) put(p *peerArena) {
	in.mu.Lock()
	defer in.mu.Unlock()
	p.users--
	if p.users == 0 && (in.closed || in.latest[p.key.rank] != p.key.gen) {
		p.m.Close()
		if in.maps[p.key] == p {
			delete(in.maps, p.key)
		}
	}
}

func (in *p2pIn) close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.closed = true
	for k, p := range in.maps {
		if p.users == 0 {
			p.m.Close()
			delete(in.maps, k)
		}
	}
	for k, p := range in.bufs {
		if p.users == 0 {
			p.m.Close()
			delete(in.bufs, k)
		}
	}
}

// p2pStats counts the messages by reference, for tests and benchmarks;
// shared, those received from a shared buffer (readShared); rung, those
// sent whose note went through the receiver's inbox (p2p_inbox.go); whole,
// those sent inline in one call, their bytes beside their dtype and shape
// (wholeMax).
type p2pStats struct {
	sent, received, shared, rung, whole atomic.Uint64
}

// refReader reads a message by reference: it claims the region, calls fn
// with its bytes (valid only during the call) and marks it read.
type refReader func(fn func(off int, data []byte) error) error

// refReaderFor returns the reader of ref, a message from rank src. It
// runs in the message's handler, under its fault guard; ctx is the
// handler's. fn gets the message's bytes chunk by chunk (refChunk each,
// the last shorter), as the sender fills them in, with their offset.
func (c *Comm) refReaderFor(ctx context.Context, src int, ref *p2pRef) refReader {
	return func(fn func(off int, data []byte) error) error {
		dir := c.p2pDir(src)
		if dir == "" {
			return fmt.Errorf("rank %d sent rank %d a message by reference, but they share no folder", src, c.rank)
		}
		if ref.Size < refHeader || ref.Size > refMaxBytes || ref.Off%refAlign != 0 || ref.Len > ref.Size ||
			ref.Off > ref.Size-refHeader || ref.Len > ref.Size-refHeader-ref.Off {
			return fmt.Errorf("rank %d sent a malformed reference: %d bytes at %d of %d", src, ref.Len, ref.Off, ref.Size)
		}
		if ref.Buf != nil && (ref.Len != 0 || ref.Buf.Len > refMaxBytes || ref.Buf.Off > refMaxBytes) {
			return fmt.Errorf("rank %d sent a malformed reference: %d bytes at %d of its shared buffer s%d", src, ref.Buf.Len, ref.Buf.Off, ref.Buf.Idx)
		}
		p, err := c.p2pIn.get(dir, src, ref.Gen, int(ref.Size))
		if err != nil {
			return fmt.Errorf("rank %d's message by reference: %w", src, err)
		}
		defer c.p2pIn.put(p)
		w := p.m.Uint64(int(ref.Off))
		if !w.CompareAndSwap(stateWord(ref.ID, refReady), stateWord(ref.ID, refReading)) {
			return fmt.Errorf("rank %d withdrew its message (its call ended before rank %d read it): %w", src, c.rank, ErrAborted)
		}
		defer w.Store(stateWord(ref.ID, refRead))
		fill := p.m.Uint32(int(ref.Off) + refFill)
		if ref.Buf != nil {
			return c.readShared(dir, src, ref.Buf, fill, fn)
		}
		data := p.m.Bytes()[int(ref.Off)+refHeader : int(ref.Off)+refHeader+int(ref.Len)]
		for i := range refChunks(len(data)) {
			if err := c.waitFill(ctx, src, fill, uint32(i+1)); err != nil {
				return err
			}
			part := data[i*refChunk : min(len(data), (i+1)*refChunk)]
			if err := fn(i*refChunk, part); err != nil {
				return err
			}
		}
		c.p2pStat.received.Add(1)
		return nil
	}
}

// testSharedP2PRead, when set (by tests), runs in readShared after the
// copy, before the check of the fill word.
var testSharedP2PRead func()

// readShared is refReaderFor's reading of a message whose bytes are in
// rank src's shared buffer b: fn gets them chunk by chunk, where they
// are; then the fill word says whether the sender gave up meanwhile
// (fillFailed), when what fn got may be torn and the message fails.
func (c *Comm) readShared(dir string, src int, b *p2pBuf, fill *shm.Uint32, fn func(off int, data []byte) error) error {
	pm, err := c.p2pIn.shared(dir, src, b.Idx, int(b.Off+b.Len))
	if err != nil {
		return fmt.Errorf("rank %d's shared buffer: %w", src, err)
	}
	defer c.p2pIn.putShared(pm)
	data := pm.m.Bytes()[b.Off : b.Off+b.Len]
	for i := range refChunks(len(data)) {
		if err := fn(i*refChunk, data[i*refChunk:min(len(data), (i+1)*refChunk)]); err != nil {
			return err
		}
	}
	if testSharedP2PRead != nil {
		testSharedP2PRead()
	}
	if fill.Load() == fillFailed {
		return fmt.Errorf("rank %d gave up sending its message while rank %d read it: %w", src, c.rank, ErrAborted)
	}
	c.p2pStat.received.Add(1)
	c.p2pStat.shared.Add(1)
	return nil
}

// waitFill waits until the fill word w (of a message from rank src) has
// reached v: a short spin, then futex waits rechecking ctx and the
// communicator's health every few milliseconds (a sender that died never
// fills it; the communicator breaks).
func (c *Comm) waitFill(ctx context.Context, src int, w *shm.Uint32, v uint32) error {
	ok := func(cur uint32) (bool, error) {
		if cur == fillFailed {
			return false, fmt.Errorf("rank %d gave up on its message part-way (its call ended, or a fault on its tensor): %w", src, ErrAborted)
		}
		return cur >= v, nil
	}
	for i := 0; i < spinsFill; i++ {
		if done, err := ok(w.Load()); done || err != nil {
			return err
		}
		if i >= spinsFill-yieldsFill {
			shm.Yield()
		}
	}
	for {
		cur := w.Load()
		if done, err := ok(cur); done || err != nil {
			return err
		}
		if err := c.err(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		w.Wait(cur, 5*time.Millisecond)
	}
}

const (
	spinsFill  = 208 // reads of a fill word before the futex, the last ...
	yieldsFill = 8   // ... of them after yielding the processor
)

// p2pDir returns the folder this rank shares with rank peer, where
// messages to it may go by reference: "" when they share none.
func (c *Comm) p2pDir(peer int) string {
	switch {
	case peer == c.rank:
		return ""
	case c.shm != nil:
		return c.shm.folder()
	case c.hier != nil && c.hier.g != nil && c.hosts[peer] == c.hosts[c.rank]:
		return c.hier.g.folder()
	}
	return ""
}

// p2pRefHook, when set (by tests), runs before a message's reference
// goes, with the arena's path: once its bytes are in the region (a
// message of one chunk), or before the first (a pipelined one).
var p2pRefHook func(path string)

// sendByRef sends message k (its first piece m, the dtype and shape) with
// the bytes b by reference, when dest shares a folder with this rank and
// b is large enough. sent false: the message is to go inline (nothing was
// sent).
func (c *Comm) sendByRef(ctx context.Context, dest int, k msgKey, m, b []byte) (sent bool, err error) {
	least := c.cfg.ShmSendMin
	if least == 0 && c.ownInbox() == nil {
		// Without inboxes a message by reference is still an rpc round
		// trip, and under a page not worth a region.
		least = ShmSendMinDefault
	}
	dir := c.p2pDir(dest)
	if least < 0 || len(b) < least || dir == "" {
		return false, nil
	}
	if c.shm != nil {
		if idx, off, ok := c.shm.locate(b); ok {
			return c.sendShared(ctx, dir, dest, k, m, len(b), &p2pBuf{Idx: idx, Off: uint64(off), Len: uint64(len(b))})
		}
	}
	r, err := c.p2pOut.alloc(dir, c.rank, len(b))
	if err != nil {
		// No room (a full folder, a message past the largest arena): the
		// bytes go over rpc.
		c.log.Debug("collective: a message inline", "rank", c.rank, "to", dest, "bytes", len(b), "why", err)
		return false, nil
	}
	n := refChunks(len(b))
	if err := guardOwn(func() error {
		r.word().Store(stateWord(r.id, refReady))
		r.fill().Store(0)
		return nil
	}); err != nil {
		// The arena's file was truncated under us: it is dropped, and this
		// message goes inline.
		c.p2pOut.free(r, true)
		return false, nil
	}
	hook := func() {
		if h := p2pRefHook; h != nil {
			h(r.a.path)
		}
	}
	// fillIn copies the bytes in chunk by chunk, each announced in the
	// fill word; a fault (the arena truncated, or the caller's tensor, a
	// mapping) ends it and is announced too, when the word is still there.
	fillIn := func(wake bool) error {
		fault := guardOwn(func() error {
			f := r.fill()
			for i := range n {
				copy(r.b[i*refChunk:min(len(b), (i+1)*refChunk)], b[i*refChunk:])
				f.Store(uint32(i + 1))
				if wake {
					f.Wake()
				}
			}
			return nil
		})
		if fault != nil {
			guardOwn(func() error { r.fill().Store(fillFailed); r.fill().Wake(); return nil })
		}
		return fault
	}
	var fault error
	if n == 1 {
		fault = fillIn(false)
		hook()
		err = c.notify(ctx, dest, k, m, r.ref())
	} else {
		// Pipelined: the reference goes first, and the bytes follow
		// whatever becomes of the call (a receiver reading waits for
		// every chunk). Through dest's inbox the note is posted before
		// the copy and its answer awaited after, all in this goroutine:
		// one of its own, waiting in a futex, kept this process's other
		// processor from running it promptly, and the note went late.
		hook()
		switch h, perr, posted := c.post(dest, k, m, r.ref()); {
		case h != nil:
			fault = fillIn(true)
			err = c.await(ctx, h)
		case posted:
			fault = fillIn(true)
			err = perr
		default:
			done := make(chan error, 1)
			go func() { done <- c.sendReq(ctx, dest, k, m, r.ref()) }()
			fault = fillIn(true)
			err = <-done
		}
	}
	if fault != nil {
		// The receiver was told (or faulted on the arena itself): this
		// rank's error is its fault. An arena whose header faults is
		// dropped; otherwise the region is settled as for a failed call.
		if guardOwn(func() error { r.word().Load(); return nil }) != nil {
			c.p2pOut.free(r, true)
		} else {
			c.settle(r, fault)
		}
		return true, fault
	}
	return true, c.sentRef(r, dest, err)
}

// notify sends the reference ref of message k (first piece m) to dest:
// through dest's inbox when it can (p2p_inbox.go), else over rpc.
func (c *Comm) notify(ctx context.Context, dest int, k msgKey, m []byte, ref *p2pRef) error {
	if err, posted := c.postNote(ctx, dest, k, m, ref); posted {
		return err
	}
	return c.sendReq(ctx, dest, k, m, ref)
}

// sentRef settles region r of a message by reference to dest whose call
// returned err, counts it when it went, and returns err, a fault said as
// the receiver's (its tensor, or this rank's file truncated), not as one
// of this rank.
func (c *Comm) sentRef(r *p2pRegion, dest int, err error) error {
	c.settle(r, err)
	if err == nil {
		c.p2pStat.sent.Add(1)
	}
	if errors.Is(err, memmap.ErrFault) {
		err = fmt.Errorf("rank %d faulted taking the message: %w", dest, err)
	}
	return err
}

// sendShared is sendByRef for n bytes in one of this rank's shared
// buffers, at buf (a flat shared-mapping communicator: its folder's
// files are rank-R.s<i>): the reference names them where they are, with a
// region of the arena for its header alone. The call returns once the
// receiver has copied them (or failed); a sender that gives up first
// withdraws the message, or, when the receiver is reading, marks it
// failed before returning, so that the receiver, which checks the mark
// after its copy, never takes bytes its caller may have changed since.
func (c *Comm) sendShared(ctx context.Context, dir string, dest int, k msgKey, m []byte, n int, buf *p2pBuf) (bool, error) {
	r, err := c.p2pOut.alloc(dir, c.rank, 0)
	if err != nil {
		return false, nil
	}
	if err := guardOwn(func() error {
		r.word().Store(stateWord(r.id, refReady))
		r.fill().Store(uint32(refChunks(n)))
		return nil
	}); err != nil {
		c.p2pOut.free(r, true)
		return false, nil
	}
	if h := p2pRefHook; h != nil {
		h(r.a.path)
	}
	ref := r.ref()
	ref.Buf = buf
	err = c.notify(ctx, dest, k, m, ref)
	if err != nil {
		guardOwn(func() error {
			if !r.word().CompareAndSwap(stateWord(r.id, refReady), stateWord(r.id, refWithdrawn)) {
				r.fill().Store(fillFailed)
			}
			return nil
		})
	}
	return true, c.sentRef(r, dest, err)
}

// peerBuf is a mapping of another rank's shared buffer for messages that
// refer to it (p2pIn.shared).
type peerBuf struct {
	key   peerBufKey
	m     *shm.Map
	users int
	stale bool // replaced (the file grew) or its file gone: unmapped with its last use
}

type peerBufKey struct {
	rank int
	idx  uint32
}

// shared maps rank src's shared buffer idx in dir (once; again when it
// grew past need) for a message's read.
func (in *p2pIn) shared(dir string, src int, idx uint32, need int) (*peerBuf, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, errorf(ErrClosed, "a message by reference from rank %d", src)
	}
	if in.bufs == nil {
		in.bufs = map[peerBufKey]*peerBuf{}
	}
	k := peerBufKey{src, idx}
	p := in.bufs[k]
	if p != nil && p.m.Len() >= need {
		p.users++
		return p, nil
	}
	if p == nil {
		// A buffer of src's not mapped yet: let go of those src has freed
		// since (their pages stay while a mapping holds them).
		for ok, q := range in.bufs {
			if ok.rank == src {
				if _, err := os.Stat(sharedPath(dir, src, ok.idx)); err != nil {
					in.dropBuf(q)
				}
			}
		}
	}
	path := sharedPath(dir, src, idx)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Size() < int64(need) {
		return nil, fmt.Errorf("s%d is %d bytes, %d needed", idx, fi.Size(), need)
	}
	m, err := shm.Open(path, int(fi.Size()), false)
	if err != nil {
		return nil, err
	}
	if p != nil {
		in.dropBuf(p)
	}
	p = &peerBuf{key: k, m: m, users: 1}
	in.bufs[k] = p
	return p, nil
}

// dropBuf takes p out of the table, unmapping it now or with its last use.
func (in *p2pIn) dropBuf(p *peerBuf) {
	if in.bufs[p.key] == p {
		delete(in.bufs, p.key)
	}
	p.stale = true
	if p.users == 0 {
		p.m.Close()
	}
}

// putShared ends a use of p.
func (in *p2pIn) putShared(p *peerBuf) {
	in.mu.Lock()
	defer in.mu.Unlock()
	p.users--
	if p.users == 0 && (p.stale || in.closed) {
		p.m.Close()
		if in.bufs[p.key] == p {
			delete(in.bufs, p.key)
		}
	}
}

// sharedPath is the file of shared buffer idx of rank (a group member)
// src in folder dir: the one name its owner makes and the others map
// (shm_shared_linux.go, and p2pIn.shared for messages that refer to it).
func sharedPath(dir string, src int, idx uint32) string {
	return filepath.Join(dir, fmt.Sprintf("rank-%d.s%d", src, idx))
}
