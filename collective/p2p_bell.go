package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/rpc"
)

// Bells (protocol 9; docs/collective.md, "Point-to-point through the
// mapping"). A point-to-point message by reference (p2p_shm.go) to a rank
// that shares the folder is announced through that folder, not over rpc:
// its bytes were in the mapping already, and now the note that they are
// there, and the answer that they were taken, are too. A round trip of a
// small message falls from two rpc calls' worth of loopback TCP and
// wake-ups to two futex wakes.
//
// Each rank of a shared folder makes bell-<rank> there while it joins,
// before any rank can send: a header page, then one ring of bellSlots
// entries (bellEntry bytes each, one page in all) for each rank of the
// communicator, which only that sender posts into. The header holds the
// bell word, which a sender adds one to (and wakes) after each posting,
// the closed word (1 once the owner closed), and a bitmap with a bit per
// sender, set by a sender after it posts: the owner swaps the bitmap's
// words to zero and looks at the rings whose bits were set, so a quiet
// ring costs nothing.
//
// An entry's first word is its state, uses<<3 | st (uses counting the
// entry's postings, so that a stale compare-and-swap never matches):
// free, posted (by the sender, after the other fields), taken (by the
// owner, compare-and-swap from posted, before it reads them), answered
// (by the owner: the answer's fields hold the error, code 0 for none),
// withdrawn (by the sender, compare-and-swap from posted: it gave up
// before the owner took it, and reuses the entry at once), or cancel (by
// the sender, compare-and-swap from taken: it gave up while the owner
// handles it, which ends the handler's wait; the entry is the sender's
// again once answered). The owner's handler is collective.msg's
// (mailbox.deliver), run in a goroutine per message as the rpc server
// runs one per call; its answer goes in the entry, then the state word,
// then a wake.
//
// A message goes over rpc as before when the receiver has no bell (it
// could not make one), the sender's ring there is full (bellSlots
// messages in flight to one rank), its dtype and shape do not fit an
// entry, or the bell's file faults.

const (
	bellMagic    = 0x6c627774 // "twbl"
	bellHeader   = 4096
	bellWordOff  = 64  // uint32: one added after each posting and cancel; futex
	bellSleeps   = 96  // uint32: 1 while the owner's loop sleeps (or is about to) on the bell word
	bellClosed   = 128 // uint32: 1 once the owner closed
	bellNews     = 192 // uint64 words: bit s set by sender s after a posting
	bellSlots    = 8
	bellEntry    = 512
	bellRing     = bellSlots * bellEntry
	bellMaxRanks = (bellHeader - bellNews) * 8

	// An entry's fields, little-endian: the message's key and reference
	// (p2pRef; flags 1 when it has Buf), the dtype and shape (the
	// message's first piece), and the answer.
	beState   = 0  // uint32
	beSleeps  = 4  // uint32: 1 while the sender sleeps (or is about to) on the state word
	beSeq     = 8  // uint64
	beTag     = 16 // int64
	beGen     = 24 // uint32
	beFlags   = 28 // uint32
	beID      = 32 // uint64
	beLen     = 40 // uint64
	beOff     = 48 // uint64
	beSize    = 56 // uint64
	beBufIdx  = 64 // uint32
	beMetaLen = 68 // uint32
	beBufLen  = 72 // uint64
	beBufOff  = 80 // uint64
	beMeta    = 88 // the first piece, up to bellMetaMax bytes
	beCode    = 256
	beReason  = 260 // uint16: the reason's length
	beMsg     = 262 // uint16: the message's length
	beText    = 264 // the reason, then the message

	bellMetaMax = beCode - beMeta
	bellTextMax = bellEntry - beText

	// A wait on a bell's word or an entry's state reads it bellSpins
	// times, yielding the processor between the last bellYields reads,
	// then sleeps on its futex, bellNap at a time between rechecks of the
	// context and the communicator (the owner's loop: 100 ms, for Close).
	bellSpins  = 200
	bellYields = 8
	bellNap    = 5 * time.Millisecond
)

// Entry states.
const (
	bellFree = iota
	bellPosted
	bellTaken
	bellAnswered
	bellWithdrawn
	bellCancel
)

// bellName is rank's bell file.
func bellName(rank int) string { return fmt.Sprintf("bell-%d", rank) }

// bellSize is the size of a bell file of a communicator of n ranks.
func bellSize(n int) int { return bellHeader + n*bellRing }

// bellIn is this rank's own bell: the file the others post into, and
// the loop that takes their messages.
type bellIn struct {
	m        *shm.Map
	path     string
	n        int
	spin     bool
	stopping chan struct{}
	done     chan struct{} // closed when the loop has returned (or never ran)
	started  bool
	handlers sync.WaitGroup
	mu       sync.Mutex
	cancels  map[int]context.CancelFunc // a taken entry's handler (ring*bellSlots+slot)
	once     sync.Once
}

// openBell makes rank's bell in dir for a communicator of n ranks; nil
// (and point-to-point over rpc) when it cannot.
func openBell(dir string, rank, n int, spin bool) *bellIn {
	if n > bellMaxRanks {
		return nil
	}
	path := filepath.Join(dir, bellName(rank))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil
	}
	defer f.Close()
	// The header's page is reserved; the rings are not (n pages, most
	// never written), and a sender's posting that faults on a full
	// folder goes over rpc instead.
	var m *shm.Map
	if err = shm.Reserve(f, bellHeader); err == nil {
		if err = f.Truncate(int64(bellSize(n))); err == nil {
			m, err = shm.MapFile(f, bellSize(n), true)
		}
	}
	if err != nil {
		os.Remove(path)
		return nil
	}
	m.Uint32(0).Store(bellMagic)
	return &bellIn{m: m, path: path, n: n, spin: spin, stopping: make(chan struct{}), done: make(chan struct{}), cancels: map[int]context.CancelFunc{}}
}

// start runs c's loop on b once the communicator has formed.
func (b *bellIn) start(c *Comm) {
	b.started = true
	go c.bellLoop(b)
}

// close stops the loop (the messages posted by then are answered
// ErrPeerLost), waits for the handlers, and unmaps and removes the file.
func (b *bellIn) close() {
	if b == nil {
		return
	}
	b.once.Do(func() {
		b.m.Uint32(bellClosed).Store(1)
		close(b.stopping)
		w := b.m.Uint32(bellWordOff)
		w.Add(1)
		w.Wake()
		if b.started {
			<-b.done
		}
		b.handlers.Wait()
		b.m.Close()
		os.Remove(b.path)
	})
}

// bellLoop takes the messages posted to b until b closes.
func (c *Comm) bellLoop(b *bellIn) {
	defer close(b.done)
	w := b.m.Uint32(bellWordOff)
	for {
		v := w.Load()
		select {
		case <-b.stopping:
			c.bellSweep(b, true)
			return
		default:
		}
		if c.bellSweep(b, false) {
			continue
		}
		if b.spin {
			for i := 0; i < bellSpins && w.Load() == v; i++ {
				if i >= bellSpins-bellYields {
					runtime.Gosched()
				}
			}
			if w.Load() != v {
				continue
			}
		}
		sleeps := b.m.Uint32(bellSleeps)
		sleeps.Store(1)
		if w.Load() == v {
			w.Wait(v, 100*time.Millisecond)
		}
		sleeps.Store(0)
	}
}

// spinUntil reads done a while before its caller sleeps: bellSpins
// times, then after each of bellYields yields of the processor. It reports whether
// done came true. (Spinning longer, as waitWord does where each rank has
// a core, made a ping-pong slower here: two such loops per process.)
func spinUntil(done func() bool) bool {
	for range bellSpins {
		if done() {
			return true
		}
	}
	for range bellYields {
		runtime.Gosched()
		if done() {
			return true
		}
	}
	return false
}

// bellSweep takes what the senders whose bits are set posted (closing:
// answers it ErrPeerLost), and passes on their cancels; it reports
// whether any bit was set.
func (c *Comm) bellSweep(b *bellIn, closing bool) bool {
	any := false
	for wi := 0; wi < (b.n+63)/64; wi++ {
		word := b.m.Uint64(bellNews + 8*wi)
		var x uint64
		for {
			x = word.Load()
			if x == 0 || word.CompareAndSwap(x, 0) {
				break
			}
		}
		for ; x != 0; x &= x - 1 {
			s := wi*64 + bits.TrailingZeros64(x)
			if s < b.n {
				any = true
				c.bellRing(b, s, closing)
			}
		}
	}
	return any
}

// bellRing looks at sender s's ring.
func (c *Comm) bellRing(b *bellIn, s int, closing bool) {
	for i := range bellSlots {
		base := bellHeader + s*bellRing + i*bellEntry
		key := s*bellSlots + i
		// A ring's page the sender could not write faults here too: such a
		// ring has nothing in it.
		guardOwn(func() error {
			st := b.m.Uint32(base + beState)
			cur := st.Load()
			switch cur & 7 {
			case bellPosted:
				if !st.CompareAndSwap(cur, cur&^7|bellTaken) {
					return nil
				}
				use := cur &^ 7
				if closing {
					bellAnswer(b.m, base, use, errorf(ErrPeerLost, "rank %d closed its communicator before receiving the message", c.rank))
					return nil
				}
				req, meta, err := bellDecode(b.m.Bytes()[base:base+bellEntry], s)
				if err == nil && bellInline(req) && c.box.posted(msgKey{src: s, space: spaceP2P, seq: req.Seq, tag: req.Tag}) {
					// Its receive is waiting and its bytes are there whole:
					// copied here (at most a chunk), saving a goroutine's
					// start and wake-up on the way.
					err = c.box.deliver(context.Background(), req, meta)
					bellAnswer(b.m, base, use, err)
					return nil
				}
				ctx, cancel := context.WithCancel(context.Background())
				b.mu.Lock()
				b.cancels[key] = cancel
				b.mu.Unlock()
				b.handlers.Add(1)
				go func() {
					defer b.handlers.Done()
					if err == nil {
						err = c.box.deliver(ctx, req, meta)
					}
					b.mu.Lock()
					delete(b.cancels, key)
					b.mu.Unlock()
					cancel()
					guardOwn(func() error { bellAnswer(b.m, base, use, err); return nil })
				}()
			case bellCancel:
				b.mu.Lock()
				if cancel := b.cancels[key]; cancel != nil {
					cancel()
				}
				b.mu.Unlock()
			}
			return nil
		})
	}
}

// bellInline reports whether message r is delivered by the loop itself
// when its receive is posted: its bytes (one chunk at most) need no wait
// for the sender's fill.
func bellInline(r msgReq) bool {
	if r.Ref.Buf != nil {
		return r.Ref.Buf.Len <= refChunk
	}
	return r.Ref.Len <= refChunk
}

// bellDecode reads a taken entry e of sender s: the message's key and
// reference, and its first piece.
func bellDecode(e []byte, s int) (msgReq, []byte, error) {
	le := binary.LittleEndian
	n := le.Uint32(e[beMetaLen:])
	if n > bellMetaMax {
		return msgReq{}, nil, fmt.Errorf("rank %d posted a malformed message: a first piece of %d bytes", s, n)
	}
	ref := &p2pRef{Gen: le.Uint32(e[beGen:]), ID: le.Uint64(e[beID:]), Len: le.Uint64(e[beLen:]), Off: le.Uint64(e[beOff:]), Size: le.Uint64(e[beSize:])}
	if le.Uint32(e[beFlags:])&1 != 0 {
		ref.Buf = &p2pBuf{Idx: le.Uint32(e[beBufIdx:]), Len: le.Uint64(e[beBufLen:]), Off: le.Uint64(e[beBufOff:])}
	}
	req := msgReq{Src: s, Space: spaceP2P, Seq: le.Uint64(e[beSeq:]), Tag: int64(le.Uint64(e[beTag:])), Ref: ref}
	return req, append([]byte(nil), e[beMeta:beMeta+int(n)]...), nil
}

// bellEncode writes message k's first piece m and reference ref into
// entry e (its state word aside).
func bellEncode(e []byte, k msgKey, m []byte, ref *p2pRef) {
	le := binary.LittleEndian
	le.PutUint64(e[beSeq:], k.seq)
	le.PutUint64(e[beTag:], uint64(k.tag))
	le.PutUint32(e[beGen:], ref.Gen)
	le.PutUint64(e[beID:], ref.ID)
	le.PutUint64(e[beLen:], ref.Len)
	le.PutUint64(e[beOff:], ref.Off)
	le.PutUint64(e[beSize:], ref.Size)
	var flags uint32
	var buf p2pBuf
	if ref.Buf != nil {
		flags, buf = 1, *ref.Buf
	}
	le.PutUint32(e[beFlags:], flags)
	le.PutUint32(e[beBufIdx:], buf.Idx)
	le.PutUint64(e[beBufLen:], buf.Len)
	le.PutUint64(e[beBufOff:], buf.Off)
	le.PutUint32(e[beMetaLen:], uint32(len(m)))
	copy(e[beMeta:], m)
}

// bellAnswer answers the entry at base (of its use) with err, then wakes
// its sender.
func bellAnswer(m *shm.Map, base int, use uint32, err error) {
	e := m.Bytes()[base : base+bellEntry]
	le := binary.LittleEndian
	var code rpc.Code
	var reason, msg string
	if err != nil {
		var re *rpc.Error
		if errors.As(err, &re) {
			code, reason, msg = re.Code, re.Reason, re.Msg
		} else {
			code, msg = rpc.CodeOf(err), err.Error()
		}
		if code == rpc.OK {
			code = rpc.Unknown
		}
		reason = reason[:min(len(reason), bellTextMax/2)]
		msg = msg[:min(len(msg), bellTextMax-len(reason))]
	}
	le.PutUint32(e[beCode:], uint32(code))
	le.PutUint16(e[beReason:], uint16(len(reason)))
	le.PutUint16(e[beMsg:], uint16(len(msg)))
	copy(e[beText:], reason)
	copy(e[beText+len(reason):], msg)
	st := m.Uint32(base + beState)
	st.Store(use | bellAnswered)
	if m.Uint32(base+beSleeps).Load() != 0 {
		st.Wake()
	}
}

// bellAnswerOf is the error an answered entry e holds (nil for none).
func bellAnswerOf(e []byte, dest int) error {
	le := binary.LittleEndian
	code := le.Uint32(e[beCode:])
	if code == 0 {
		return nil
	}
	rl, ml := int(le.Uint16(e[beReason:])), int(le.Uint16(e[beMsg:]))
	if code > 255 || rl+ml > bellTextMax {
		return errorf(ErrPeerLost, "rank %d answered a message with a malformed error", dest)
	}
	return &rpc.Error{Code: rpc.Code(code), Reason: string(e[beText : beText+rl]), Msg: string(e[beText+rl : beText+rl+ml])}
}

// bellOut is this rank's use of the others' bells.
type bellOut struct {
	mu     sync.Mutex
	peers  map[int]*bellPeer
	closed bool
}

// bellPeer is another rank's bell, mapped on the first message to it, and
// the entries of this rank's ring there that are in use.
type bellPeer struct {
	m     *shm.Map // nil: the rank has no bell
	users int
	busy  [bellSlots]bool   // in use by a call, or left to reclaim
	left  [bellSlots]bool   // given up on while taken: free once answered
	uses  [bellSlots]uint32 // postings, for the state word
}

// acquire returns dest's bell (in dir, of a communicator of n ranks) and a
// free entry of this rank's ring there; ok false when there is none.
func (o *bellOut) acquire(dir string, me, dest, n int) (p *bellPeer, slot int, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, 0, false
	}
	if o.peers == nil {
		o.peers = map[int]*bellPeer{}
	}
	p = o.peers[dest]
	if p == nil {
		p = &bellPeer{}
		if m, err := shm.Open(filepath.Join(dir, bellName(dest)), bellSize(n), true); err == nil {
			if guardOwn(func() error {
				if m.Uint32(0).Load() != bellMagic {
					return errors.New("not a bell")
				}
				return nil
			}) == nil {
				p.m = m
			} else {
				m.Close()
			}
		}
		o.peers[dest] = p
	}
	if p.m == nil {
		return nil, 0, false
	}
	for i := range bellSlots {
		if p.left[i] {
			base := bellHeader + me*bellRing + i*bellEntry
			var st uint32
			if guardOwn(func() error { st = p.m.Uint32(base).Load(); return nil }) == nil && st&7 == bellAnswered {
				p.left[i], p.busy[i] = false, false
			}
		}
		if !p.busy[i] {
			p.busy[i] = true
			p.users++
			p.uses[i]++
			return p, i, true
		}
	}
	return nil, 0, false
}

// release ends a call's use of entry i of p: free, or (left) free once
// its owner answers.
func (o *bellOut) release(p *bellPeer, i int, left bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if left {
		p.left[i] = true
	} else {
		p.busy[i] = false
	}
	p.users--
	if o.closed && p.users == 0 && p.m != nil {
		p.m.Close()
		p.m = nil
	}
}

// drop forgets dest's bell after a fault on it: later messages go over
// rpc.
func (o *bellOut) drop(p *bellPeer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for d, q := range o.peers {
		if q == p {
			o.peers[d] = &bellPeer{}
		}
	}
}

func (o *bellOut) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for _, p := range o.peers {
		if p.users == 0 && p.m != nil {
			p.m.Close()
			p.m = nil
		}
	}
}

// ownBell is this rank's bell, or nil.
func (c *Comm) ownBell() *bellIn {
	switch {
	case c.shm != nil:
		return c.shm.bell
	case c.hier != nil && c.hier.g != nil:
		return c.hier.g.bell
	}
	return nil
}

// ring sends message k (first piece m, bytes by ref) to dest through its
// bell and returns the answer; posted false: it was not posted (no bell,
// no free entry, a first piece too large), and the message is to go
// over rpc.
func (c *Comm) ring(ctx context.Context, dest int, k msgKey, m []byte, ref *p2pRef) (err error, posted bool) {
	dir := c.p2pDir(dest)
	if dir == "" || len(m) > bellMetaMax || c.ownBell() == nil {
		return nil, false
	}
	p, i, ok := c.bells.acquire(dir, c.rank, dest, c.size)
	if !ok {
		return nil, false
	}
	base := bellHeader + c.rank*bellRing + i*bellEntry
	use := p.uses[i] << 3
	left := false
	defer func() { c.bells.release(p, i, left) }()
	fault := guardOwn(func() error {
		if p.m.Uint32(bellClosed).Load() != 0 {
			err = errorf(ErrPeerLost, "rank %d closed its communicator before receiving the message", dest)
			posted = true
			return nil
		}
		bellEncode(p.m.Bytes()[base:base+bellEntry], k, m, ref)
		p.m.Uint32(base + beState).Store(use | bellPosted)
		posted = true
		c.bellRing1(p.m)
		return nil
	})
	if fault != nil {
		c.bells.drop(p)
		if !posted {
			return nil, false
		}
		return fault, true
	}
	if err != nil {
		return err, true
	}
	var giveUp error
	fault = guardOwn(func() error {
		st := p.m.Uint32(base + beState)
		sleeps := p.m.Uint32(base + beSleeps)
		e := p.m.Bytes()[base : base+bellEntry]
		spinUntil(func() bool { return st.Load() == use|bellAnswered })
		for {
			cur := st.Load()
			if cur == use|bellAnswered {
				err = bellAnswerOf(e, dest)
				return nil
			}
			switch {
			case c.err() != nil:
				giveUp = c.err()
			case ctx.Err() != nil:
				giveUp = ctx.Err()
			case p.m.Uint32(bellClosed).Load() != 0:
				giveUp = errorf(ErrPeerLost, "rank %d closed its communicator before receiving the message", dest)
			}
			if giveUp == nil {
				sleeps.Store(1)
				if st.Load() == cur {
					st.Wait(cur, bellNap)
				}
				sleeps.Store(0)
				continue
			}
			// Withdrawn before the receiver took it, or the receiver asked
			// to end its handler; the entry is reclaimed once answered.
			if st.CompareAndSwap(use|bellPosted, use|bellWithdrawn) {
				return nil
			}
			if st.CompareAndSwap(use|bellTaken, use|bellCancel) {
				left = true
				c.bellRing1(p.m)
				return nil
			}
			if st.Load() == use|bellAnswered {
				giveUp = nil
				err = bellAnswerOf(e, dest)
			}
			return nil
		}
	})
	if fault != nil {
		c.bells.drop(p)
		left = true // never reused
		return fault, true
	}
	if giveUp != nil {
		return giveUp, true
	}
	if err != nil {
		return c.lostErr(ctx, dest, err), true
	}
	c.p2pStat.rung.Add(1)
	return nil, true
}

// bellRing1 announces a posting (or a cancel) in bell m: this rank's bit,
// then the word and a wake.
func (c *Comm) bellRing1(m *shm.Map) {
	word := m.Uint64(bellNews + 8*(c.rank/64))
	bit := uint64(1) << (c.rank % 64)
	for {
		x := word.Load()
		if x&bit != 0 || word.CompareAndSwap(x, x|bit) {
			break
		}
	}
	w := m.Uint32(bellWordOff)
	w.Add(1)
	if m.Uint32(bellSleeps).Load() != 0 {
		w.Wake()
	}
}
