package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/rpc"
)

// Inboxes (protocol 9; docs/collective.md, "Point-to-point through the
// mapping"). A point-to-point message by reference (p2p_shm.go) to a rank
// that shares the folder is announced through that folder, not over rpc:
// its bytes were in the mapping already, and now the note that they are
// there, and the answer that they were taken, are too. A round trip of a
// small message falls from two rpc calls' worth of loopback TCP and
// wake-ups to two futex wakes.
//
// Each rank of a shared folder makes inbox-<rank> there while it joins,
// before any rank can send: a header page, then one ring of inboxSlots
// entries (inboxEntry bytes each, one page in all) for each rank of the
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
// (mailbox.deliver): run by the loop itself when the message's receive is
// posted and its bytes are one chunk, else in a goroutine per message as
// the rpc server runs one per call; its answer goes in the entry, then the
// state word, then a wake when the sender's sleep flag is set (the
// owner's loop has one too, in the header).
//
// A message goes over rpc as before when the receiver has no inbox (it
// could not make one), the sender's ring there is full (inboxSlots
// messages in flight to one rank), its dtype and shape do not fit an
// entry, or the inbox's file faults.

const (
	inboxMagic    = 0x62697774 // "twib"
	inboxHeader   = 4096
	inboxBell     = 64  // uint32: one added after each posting and cancel; futex
	inboxSleeps   = 96  // uint32: 1 while the owner's loop sleeps (or is about to) on the bell word
	inboxClosed   = 128 // uint32: 1 once the owner closed
	inboxNews     = 192 // uint64 words: bit s set by sender s after a posting
	inboxSlots    = 8
	inboxEntry    = 512
	inboxRing     = inboxSlots * inboxEntry
	inboxMaxRanks = (inboxHeader - inboxNews) * 8

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
	beMeta    = 88 // the first piece, up to inboxMetaMax bytes
	beCode    = 256
	beReason  = 260 // uint16: the reason's length
	beMsg     = 262 // uint16: the message's length
	beText    = 264 // the reason, then the message

	inboxMetaMax = beCode - beMeta
	inboxTextMax = inboxEntry - beText

	// A wait on an inbox's bell word or an entry's state reads it inboxSpins
	// times, yielding the processor between the last inboxYields reads,
	// then sleeps on its futex, inboxNap at a time between rechecks of the
	// context and the communicator (the owner's loop: 100 ms, for Close).
	inboxSpins  = 200
	inboxYields = 8
	inboxNap    = 5 * time.Millisecond
)

// Entry states.
const (
	entryFree = iota
	entryPosted
	entryTaken
	entryAnswered
	entryWithdrawn
	entryCancel
)

// inboxName is rank's inbox file.
func inboxName(rank int) string { return fmt.Sprintf("inbox-%d", rank) }

// inboxSize is the size of an inbox file of a communicator of n ranks.
func inboxSize(n int) int { return inboxHeader + n*inboxRing }

// inbox is this rank's own inbox: the file the others post into, and
// the loop that takes their messages.
type inbox struct {
	m        *shm.Map
	path     string
	n        int
	spin     bool
	stopping chan struct{}
	done     chan struct{} // closed when the loop has returned (or never ran)
	started  bool
	handlers sync.WaitGroup
	mu       sync.Mutex
	cancels  map[int]context.CancelFunc // a taken entry's handler (ring*inboxSlots+slot)
	once     sync.Once
}

// openInbox makes rank's inbox in dir for a communicator of n ranks; nil
// (and point-to-point over rpc) when it cannot.
func openInbox(dir string, rank, n int, spin bool) *inbox {
	if n > inboxMaxRanks {
		return nil
	}
	path := filepath.Join(dir, inboxName(rank))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil
	}
	defer f.Close()
	// The header's page is reserved; the rings are not (n pages, most
	// never written), and a sender's posting that faults on a full
	// folder goes over rpc instead.
	var m *shm.Map
	if err = shm.Reserve(f, inboxHeader); err == nil {
		if err = f.Truncate(int64(inboxSize(n))); err == nil {
			m, err = shm.MapFile(f, inboxSize(n), true)
		}
	}
	if err != nil {
		os.Remove(path)
		return nil
	}
	m.Uint32(0).Store(inboxMagic)
	return &inbox{m: m, path: path, n: n, spin: spin, stopping: make(chan struct{}), done: make(chan struct{}), cancels: map[int]context.CancelFunc{}}
}

// start runs c's loop on b once the communicator has formed.
func (b *inbox) start(c *Comm) {
	b.started = true
	go c.inboxLoop(b)
}

// close stops the loop (the messages posted by then are answered
// ErrPeerLost), waits for the handlers, and unmaps and removes the file.
func (b *inbox) close() {
	if b == nil {
		return
	}
	b.once.Do(func() {
		close(b.stopping)
		guardOwn(func() error {
			b.m.Uint32(inboxClosed).Store(1)
			w := b.m.Uint32(inboxBell)
			w.Add(1)
			w.Wake()
			return nil
		})
		if b.started {
			<-b.done
		}
		b.handlers.Wait()
		b.m.Close()
		os.Remove(b.path)
	})
}

// inboxLoop takes the messages posted to b until b closes. A fault on
// b's file (truncated by hand) breaks this rank off: it can no longer
// hear its messages, and the others hear so through their watches rather
// than wait for answers that cannot come.
func (c *Comm) inboxLoop(b *inbox) {
	defer close(b.done)
	if fault := guardOwn(func() error { c.inboxWatch(b); return nil }); fault != nil {
		c.failOwn(errorf(ErrAborted, "rank %d's inbox faulted (its file truncated?): %v", c.rank, fault), fault)
	}
}

// inboxWatch is inboxLoop's work: a sweep whenever the bell word moves,
// a short spin (where each rank has a core) and a futex sleep, with the
// sleep flag set, when it does not; after b closes, a last sweep.
func (c *Comm) inboxWatch(b *inbox) {
	w := b.m.Uint32(inboxBell)
	for {
		v := w.Load()
		select {
		case <-b.stopping:
			c.inboxSweep(b, true)
			return
		default:
		}
		if c.inboxSweep(b, false) {
			continue
		}
		if b.spin {
			for i := 0; i < inboxSpins && w.Load() == v; i++ {
				if i >= inboxSpins-inboxYields {
					shm.Yield()
				}
			}
			if w.Load() != v {
				continue
			}
		}
		sleeps := b.m.Uint32(inboxSleeps)
		sleeps.Store(1)
		if w.Load() == v {
			w.Wait(v, 100*time.Millisecond)
		}
		sleeps.Store(0)
	}
}

// spinUntil reads done a while before its caller sleeps: inboxSpins
// times, then after each of inboxYields yields of the processor. It
// reports whether done came true. (Spinning longer, as waitWord does where each rank has
// a core, made a ping-pong slower here: two such loops per process.)
func spinUntil(done func() bool) bool {
	for range inboxSpins {
		if done() {
			return true
		}
	}
	for range inboxYields {
		shm.Yield()
		if done() {
			return true
		}
	}
	return false
}

// inboxSweep takes what the senders whose bits are set posted (closing:
// answers it ErrPeerLost), and passes on their cancels; it reports
// whether any bit was set.
func (c *Comm) inboxSweep(b *inbox, closing bool) bool {
	any := false
	for wi := 0; wi < (b.n+63)/64; wi++ {
		word := b.m.Uint64(inboxNews + 8*wi)
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
				c.inboxRing(b, s, closing)
			}
		}
	}
	return any
}

// inboxRing looks at sender s's ring.
func (c *Comm) inboxRing(b *inbox, s int, closing bool) {
	for i := range inboxSlots {
		base := inboxHeader + s*inboxRing + i*inboxEntry
		key := s*inboxSlots + i
		// A ring's page the sender could not write faults here too: such a
		// ring has nothing in it.
		guardOwn(func() error {
			st := b.m.Uint32(base + beState)
			cur := st.Load()
			switch cur & 7 {
			case entryPosted:
				if !st.CompareAndSwap(cur, cur&^7|entryTaken) {
					return nil
				}
				use := cur &^ 7
				if closing {
					answerEntry(b.m, base, use, errorf(ErrPeerLost, "rank %d closed its communicator before receiving the message", c.rank))
					return nil
				}
				req, meta, err := decodeEntry(b.m.Bytes()[base:base+inboxEntry], s)
				if err == nil && takenInline(req) {
					// Its receive is waiting and its bytes are there whole:
					// copied here (at most a chunk), saving a goroutine's
					// start and wake-up on the way.
					if err := c.box.deliverIf(context.Background(), req, meta, nil, true); err != errNotPosted {
						answerEntry(b.m, base, use, err)
						return nil
					}
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
					guardOwn(func() error { answerEntry(b.m, base, use, err); return nil })
				}()
			case entryCancel:
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

// takenInline reports whether message r is delivered by the loop itself
// when its receive is posted: its bytes (one chunk at most) need no wait
// for the sender's fill.
func takenInline(r msgReq) bool {
	if r.Ref.Buf != nil {
		return r.Ref.Buf.Len <= refChunk
	}
	return r.Ref.Len <= refChunk
}

// decodeEntry reads a taken entry e of sender s: the message's key and
// reference, and its first piece.
func decodeEntry(e []byte, s int) (msgReq, []byte, error) {
	le := binary.LittleEndian
	n := le.Uint32(e[beMetaLen:])
	if n > inboxMetaMax {
		return msgReq{}, nil, fmt.Errorf("rank %d posted a malformed message: a first piece of %d bytes", s, n)
	}
	ref := &p2pRef{Gen: le.Uint32(e[beGen:]), ID: le.Uint64(e[beID:]), Len: le.Uint64(e[beLen:]), Off: le.Uint64(e[beOff:]), Size: le.Uint64(e[beSize:])}
	if le.Uint32(e[beFlags:])&1 != 0 {
		ref.Buf = &p2pBuf{Idx: le.Uint32(e[beBufIdx:]), Len: le.Uint64(e[beBufLen:]), Off: le.Uint64(e[beBufOff:])}
	}
	req := msgReq{Src: s, Space: spaceP2P, Seq: le.Uint64(e[beSeq:]), Tag: int64(le.Uint64(e[beTag:])), Ref: ref}
	return req, append([]byte(nil), e[beMeta:beMeta+int(n)]...), nil
}

// encodeEntry writes message k's first piece m and reference ref into
// entry e (its state word aside).
func encodeEntry(e []byte, k msgKey, m []byte, ref *p2pRef) {
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

// answerEntry answers the entry at base (of its use) with err, then wakes
// its sender.
func answerEntry(m *shm.Map, base int, use uint32, err error) {
	e := m.Bytes()[base : base+inboxEntry]
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
		reason = reason[:min(len(reason), inboxTextMax/2)]
		msg = msg[:min(len(msg), inboxTextMax-len(reason))]
	}
	le.PutUint32(e[beCode:], uint32(code))
	le.PutUint16(e[beReason:], uint16(len(reason)))
	le.PutUint16(e[beMsg:], uint16(len(msg)))
	copy(e[beText:], reason)
	copy(e[beText+len(reason):], msg)
	st := m.Uint32(base + beState)
	st.Store(use | entryAnswered)
	if m.Uint32(base+beSleeps).Load() != 0 {
		st.Wake()
	}
}

// entryAnswer is the error an answered entry e holds (nil for none).
func entryAnswer(e []byte, dest int) error {
	le := binary.LittleEndian
	code := le.Uint32(e[beCode:])
	if code == 0 {
		return nil
	}
	rl, ml := int(le.Uint16(e[beReason:])), int(le.Uint16(e[beMsg:]))
	if code > 255 || rl+ml > inboxTextMax {
		return errorf(ErrPeerLost, "rank %d answered a message with a malformed error", dest)
	}
	return &rpc.Error{Code: rpc.Code(code), Reason: string(e[beText : beText+rl]), Msg: string(e[beText+rl : beText+rl+ml])}
}

// peerInboxes is this rank's use of the others' inboxes.
type peerInboxes struct {
	mu     sync.Mutex
	peers  map[int]*peerInbox
	closed bool
}

// peerInbox is another rank's inbox, mapped on the first message to it, and
// the entries of this rank's ring there that are in use.
type peerInbox struct {
	m       *shm.Map // nil: the rank has no inbox
	users   int
	dropped bool                  // faulted: unmapped with its last use
	slots   [inboxSlots]entryHold // this rank's hold on each entry of its ring
	uses    [inboxSlots]uint32    // postings, for the state word
}

// entryHold is a sender's hold on an entry of its ring.
type entryHold uint8

const (
	entryOurs  entryHold = iota // free for a posting
	entryInUse                  // a call's
	entryLeft                   // given up on while taken: ours again once answered
)

// acquire returns dest's inbox (in dir, of a communicator of n ranks) and a
// free entry of this rank's ring there; ok false when there is none.
func (o *peerInboxes) acquire(dir string, me, dest, n int) (p *peerInbox, slot int, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, 0, false
	}
	if o.peers == nil {
		o.peers = map[int]*peerInbox{}
	}
	p = o.peers[dest]
	if p == nil {
		p = &peerInbox{}
		if m, err := shm.Open(filepath.Join(dir, inboxName(dest)), inboxSize(n), true); err == nil {
			if guardOwn(func() error {
				if m.Uint32(0).Load() != inboxMagic {
					return errors.New("not an inbox")
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
	for i := range inboxSlots {
		if p.slots[i] == entryLeft {
			base := inboxHeader + me*inboxRing + i*inboxEntry
			var st uint32
			if guardOwn(func() error { st = p.m.Uint32(base).Load(); return nil }) == nil && st&7 == entryAnswered {
				p.slots[i] = entryOurs
			}
		}
		if p.slots[i] == entryOurs {
			p.slots[i] = entryInUse
			p.users++
			p.uses[i]++
			return p, i, true
		}
	}
	return nil, 0, false
}

// release ends a call's use of entry i of p: free, or (left) free once
// its owner answers.
func (o *peerInboxes) release(p *peerInbox, i int, left bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p.slots[i] = entryOurs
	if left {
		p.slots[i] = entryLeft // ours again once answered (acquire)
	}
	p.users--
	if (o.closed || p.dropped) && p.users == 0 && p.m != nil {
		p.m.Close()
		p.m = nil
	}
}

// drop forgets dest's inbox after a fault on it: later messages go over
// rpc.
func (o *peerInboxes) drop(p *peerInbox) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for d, q := range o.peers {
		if q == p {
			o.peers[d] = &peerInbox{}
		}
	}
	p.dropped = true
	if p.users == 0 && p.m != nil {
		p.m.Close()
		p.m = nil
	}
}

func (o *peerInboxes) close() {
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

// ownInbox is this rank's inbox, or nil.
func (c *Comm) ownInbox() *inbox {
	switch {
	case c.shm != nil:
		return c.shm.inbox
	case c.hier != nil && c.hier.g != nil:
		return c.hier.g.inbox
	}
	return nil
}

// posting is a note posted in dest's inbox: entry i of this rank's ring
// there, at base, in its use.
type posting struct {
	p    *peerInbox
	i    int
	base int
	use  uint32
	dest int
}

// postNote sends message k (first piece m, bytes by ref) to dest through
// its inbox and returns the answer; posted false: it was not posted (no
// inbox, no free entry, a first piece too large), and the message is to
// go over rpc.
func (c *Comm) postNote(ctx context.Context, dest int, k msgKey, m []byte, ref *p2pRef) (err error, posted bool) {
	h, err, posted := c.post(dest, k, m, ref)
	if h == nil {
		return err, posted
	}
	return c.await(ctx, h), true
}

// post posts message k's note in dest's inbox, without waiting: h, to
// await, when it did; else posted says whether it is to go over rpc
// (false) or failed with err (the receiver closed, a fault after the
// posting).
func (c *Comm) post(dest int, k msgKey, m []byte, ref *p2pRef) (h *posting, err error, posted bool) {
	dir := c.p2pDir(dest)
	if dir == "" || len(m) > inboxMetaMax || c.ownInbox() == nil {
		return nil, nil, false
	}
	p, i, ok := c.inboxes.acquire(dir, c.rank, dest, c.size)
	if !ok {
		return nil, nil, false
	}
	h = &posting{p: p, i: i, base: inboxHeader + c.rank*inboxRing + i*inboxEntry, use: p.uses[i] << 3, dest: dest}
	fault := guardOwn(func() error {
		if p.m.Uint32(inboxClosed).Load() != 0 {
			err = errorf(ErrPeerLost, "rank %d closed its communicator before receiving the message", dest)
			return nil
		}
		encodeEntry(p.m.Bytes()[h.base:h.base+inboxEntry], k, m, ref)
		p.m.Uint32(h.base + beState).Store(h.use | entryPosted)
		posted = true
		c.ring(p.m)
		return nil
	})
	switch {
	case fault != nil:
		c.inboxes.drop(p)
		c.inboxes.release(p, i, posted) // a posted entry is never reused
		return nil, fault, posted
	case err != nil:
		c.inboxes.release(p, i, false)
		return nil, err, true
	}
	return h, nil, true
}

// await waits for the answer to posting h and lets go of its entry.
func (c *Comm) await(ctx context.Context, h *posting) (err error) {
	p, base, use, dest := h.p, h.base, h.use, h.dest
	left := false
	defer func() { c.inboxes.release(p, h.i, left) }()
	var giveUp error
	fault := guardOwn(func() error {
		st := p.m.Uint32(base + beState)
		sleeps := p.m.Uint32(base + beSleeps)
		e := p.m.Bytes()[base : base+inboxEntry]
		spinUntil(func() bool { return st.Load() == use|entryAnswered })
		for {
			cur := st.Load()
			if cur == use|entryAnswered {
				err = entryAnswer(e, dest)
				return nil
			}
			switch {
			case c.err() != nil:
				giveUp = c.err()
			case ctx.Err() != nil:
				giveUp = ctx.Err()
			case p.m.Uint32(inboxClosed).Load() != 0:
				giveUp = errorf(ErrPeerLost, "rank %d closed its communicator before receiving the message", dest)
			}
			if giveUp == nil {
				sleeps.Store(1)
				if st.Load() == cur {
					st.Wait(cur, inboxNap)
				}
				sleeps.Store(0)
				continue
			}
			// Withdrawn before the receiver took it, or the receiver asked
			// to end its handler; the entry is reclaimed once answered.
			if st.CompareAndSwap(use|entryPosted, use|entryWithdrawn) {
				return nil
			}
			if st.CompareAndSwap(use|entryTaken, use|entryCancel) {
				left = true
				c.ring(p.m)
				return nil
			}
			if st.Load() == use|entryAnswered {
				giveUp = nil
				err = entryAnswer(e, dest)
			}
			return nil
		}
	})
	if fault != nil {
		c.inboxes.drop(p)
		left = true // never reused
		return fault
	}
	if giveUp != nil {
		return giveUp
	}
	if err != nil {
		return c.lostErr(ctx, dest, err)
	}
	c.p2pStat.rung.Add(1)
	return nil
}

// ring announces a posting (or a cancel) in inbox m: this rank's bit,
// then the word and a wake.
func (c *Comm) ring(m *shm.Map) {
	word := m.Uint64(inboxNews + 8*(c.rank/64))
	bit := uint64(1) << (c.rank % 64)
	for {
		x := word.Load()
		if x&bit != 0 || word.CompareAndSwap(x, x|bit) {
			break
		}
	}
	w := m.Uint32(inboxBell)
	w.Add(1)
	if m.Uint32(inboxSleeps).Load() != 0 {
		w.Wake()
	}
}
