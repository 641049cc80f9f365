package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Messages between ranks over their rpc connections: what the TCP
// transport moves tensors with, and what point-to-point calls use on every
// transport. A message is one rpc call, collective.msg, whose request
// names the message (msgKey) and carries its bytes as a one-tensor
// TensorDict after the msgpack header (never inside it). The receiver
// posts where a message goes (mailbox.post) and the handler that receives
// it hands its bytes straight to that consumer: a sender's call returns
// once its bytes are consumed, so a message is never buffered twice, and
// a rank that is not ready for a message holds its sender back (the
// handler waits, bounded by the sender's deadline).

// spaces of message keys.
const (
	spaceDesc uint8 = iota + 1 // a collective's descriptions
	spaceData                  // a collective's data
	spaceP2P                   // Send and Recv
)

// msgKey names one message to this rank.
type msgKey struct {
	src   int
	space uint8
	seq   uint64 // collective: its number; p2p: the count of messages with this tag
	tag   int64  // p2p: the user's tag
	step  uint32 // collective: the algorithm's step
	piece uint32 // which piece of a split message
}

type msgReq struct {
	Session uint64 `codec:"session"`
	Src     int    `codec:"src"`
	Space   uint8  `codec:"space"`
	Seq     uint64 `codec:"seq"`
	Tag     int64  `codec:"tag"`
	Step    uint32 `codec:"step"`
	Piece   uint32 `codec:"piece"`
	Data    rpc.TD `codec:"data"`
	// Ref, in a point-to-point message's first piece: its bytes are in
	// the sender's p2p file (p2p_shm.go), not in a second message. Left
	// out when nil (every other message).
	Ref *p2pRef `codec:"ref,omitempty"`
}

// slot is a message expected or arrived.
type slot struct {
	consume func(b []byte) error
	// ref, when set, consumes the message when it comes with a reference
	// (a point-to-point message's first piece): b as consume's, and the
	// reader of the bytes referred to.
	ref func(b []byte, rd refReader) error
	// whole, when set, consumes the message when its first piece carries
	// its bytes too (protocol 10: a small point-to-point message in one
	// call): b as consume's, and the bytes.
	whole  func(b, data []byte) error
	taken  bool          // a handler is consuming it
	posted chan struct{} // closed once consume is set
	done   chan struct{} // closed once consumed
	err    error
}

type mailbox struct {
	c      *Comm
	mu     sync.Mutex
	slots  map[msgKey]*slot
	failed chan struct{}
	err    error
}

func newMailbox(c *Comm) *mailbox {
	return &mailbox{c: c, slots: map[msgKey]*slot{}, failed: make(chan struct{})}
}

func (m *mailbox) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil {
		m.err = err
		close(m.failed)
	}
}

func (m *mailbox) slot(k msgKey) *slot {
	s := m.slots[k]
	if s == nil {
		s = &slot{posted: make(chan struct{}), done: make(chan struct{})}
		m.slots[k] = s
	}
	return s
}

// post says that message k goes to consume, which the handler calls with
// its bytes (valid only during the call).
func (m *mailbox) post(k msgKey, consume func(b []byte) error) *slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.slot(k)
	s.consume = consume
	close(s.posted)
	return s
}

// isClosed reports whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// postRef is post for a message that may come with a reference or whole:
// consume takes it without either, ref with a reference, whole with its
// bytes in its first piece.
func (m *mailbox) postRef(k msgKey, consume func(b []byte) error, ref func(b []byte, rd refReader) error, whole func(b, data []byte) error) *slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.slot(k)
	s.consume, s.ref, s.whole = consume, ref, whole
	close(s.posted)
	return s
}

// wait waits for a posted message to be consumed. A message a handler
// had taken when ctx ended or the mailbox failed is waited for (the
// handler writes into the receiver's memory) and then counts as
// consumed: wait returns its consumer's error, nil when the bytes are in
// place, as its sender is told. A receiver whose ctx ended at that moment
// has its message all the same (a Recv returns nil); a collective breaks
// off all the same through its other waits and failData.
//
// A point-to-point receive also ends when its sender closed its
// communicator (peerClosed) before any of the message came: a rank's
// Send returns only once the receiver has the bytes, so nothing of a
// closed rank's can come after that. It fails with ErrPeerLost, and the
// communicator goes on.
func (m *mailbox) wait(ctx context.Context, k msgKey, s *slot) error {
	var gone chan struct{} // nil, never ready: a collective's message
	if k.space == spaceP2P {
		gone = m.c.gone[k.src]
	}
	srcGone := false
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
	case <-m.failed:
	case <-gone:
		srcGone = true
	}
	m.mu.Lock()
	if m.slots[k] == s {
		delete(m.slots, k) // a handler that comes later makes a new slot and waits in vain
	}
	err, taken := m.err, s.taken
	m.mu.Unlock()
	if srcGone && !taken && err == nil {
		if isClosed(s.done) {
			return s.err
		}
		return errorf(ErrPeerLost, "rank %d closed its communicator before sending rank %d the message (tag %d)", k.src, m.c.rank, k.tag)
	}
	if taken {
		// A handler is writing into the receiver's memory: let it finish
		// (a copy) before the caller gets its buffer back. Its result is
		// the message's, which its sender hears: the receiver reports the
		// same (before, it reported ctx's end although the bytes were in
		// place and the sender told success, and the message was lost).
		<-s.done
		return s.err
	}
	if err != nil {
		return err
	}
	return ctx.Err()
}

// failedErr is the answer to message r when this rank's mailbox failed:
// why. A point-to-point sender whose receiver closed hears ErrPeerLost
// saying so, as for a rank that died, not ErrClosed, which it could not
// tell from its own.
func (m *mailbox) failedErr(r msgReq) error {
	if r.Space == spaceP2P && errors.Is(m.err, ErrClosed) {
		return errorf(ErrPeerLost, "rank %d closed its communicator before receiving the message", m.c.rank)
	}
	return m.err
}

// abandoned is the answer to message r whose receiver stopped waiting for
// it (mailbox.wait) between the handler finding its slot and taking it.
// In a collective that means the receiver is breaking off: its
// communicator breaks with why within moments (failData), and the sender
// hears that cause (gaveUp), not this rank's name, so that every rank
// reports the rank that failed first. The wait (causeWithin) is bounded
// against news that never comes; a point-to-point receiver whose Recv
// ended breaks nothing, and its sender hears at once that it gave up.
func (m *mailbox) abandoned(ctx context.Context, r msgReq) error {
	if r.Space != spaceP2P {
		m.c.causeWithin(ctx, abortCauseWait) // only to wait: gaveUp gives the cause
	}
	return m.c.gaveUp(nil)
}

// handle is collective.msg: it hands the message to its consumer, waiting
// for the receiver to post it.
func (m *mailbox) handle(ctx context.Context, r msgReq) (rpc.Empty, error) {
	c := m.c
	select {
	case <-c.ready:
	case <-ctx.Done():
		return rpc.Empty{}, ctx.Err()
	case <-m.failed:
		return rpc.Empty{}, m.failedErr(r)
	}
	if r.Session != c.session {
		return rpc.Empty{}, errorf(ErrPeerLost, "a message for session %x reached session %x", r.Session, c.session)
	}
	var b, data []byte
	if r.Data.TensorDict != nil {
		t, err := r.Data.Tensor("b")
		if err != nil {
			return rpc.Empty{}, err
		}
		if b, err = t.Bytes(); err != nil {
			return rpc.Empty{}, err
		}
		if r.Data.Has("d") {
			// A whole point-to-point message (protocol 10): its bytes
			// after its dtype and shape.
			t, err := r.Data.Tensor("d")
			if err != nil {
				return rpc.Empty{}, err
			}
			if data, err = t.Bytes(); err != nil {
				return rpc.Empty{}, err
			}
			if data == nil {
				data = []byte{}
			}
		}
	}
	return rpc.Empty{}, m.deliverIf(ctx, r, b, data, false)
}

// deliver hands message r, whose bytes (or first piece) are b, to its
// consumer once the receiver posts it: collective.msg's work, and an
// inbox's (p2p_inbox.go). ctx ends with the sender's call.
func (m *mailbox) deliver(ctx context.Context, r msgReq, b []byte) error {
	return m.deliverIf(ctx, r, b, nil, false)
}

// errNotPosted: deliverIf found the message's receive not posted.
var errNotPosted = errors.New("collective: the receive is not posted")

// deliverIf is deliver; with posted, only when the message's receive is
// posted now (else errNotPosted, and nothing changed), so that a caller
// that must not wait (an inbox's loop) never waits for one. data, not
// nil, is the bytes of a whole message (protocol 10), b its first piece.
func (m *mailbox) deliverIf(ctx context.Context, r msgReq, b, data []byte, posted bool) error {
	c := m.c
	k := msgKey{src: r.Src, space: r.Space, seq: r.Seq, tag: r.Tag, step: r.Step, piece: r.Piece}
	m.mu.Lock()
	s := m.slots[k]
	if posted && (s == nil || !isClosed(s.posted)) {
		m.mu.Unlock()
		return errNotPosted
	}
	if s == nil {
		s = m.slot(k)
	}
	m.mu.Unlock()
	select {
	case <-s.posted:
	case <-ctx.Done():
		m.mu.Lock()
		if m.slots[k] == s {
			delete(m.slots, k)
		}
		m.mu.Unlock()
		return ctx.Err()
	case <-m.failed:
		return m.failedErr(r)
	}
	m.mu.Lock()
	if m.slots[k] != s {
		m.mu.Unlock()
		// The receiver stopped waiting since this handler found the slot.
		return m.abandoned(ctx, r)
	}
	delete(m.slots, k)
	s.taken = true
	m.mu.Unlock()
	// The consumer writes into the receiver's buffers, which may be a
	// mapping: a fault there fails the message (and, through its waiter,
	// the collective), not the process.
	switch {
	case data != nil && s.whole == nil:
		s.err = ownErr(fmt.Errorf("rank %d sent its bytes in a message's first piece (space %d, step %d), which takes none", r.Src, r.Space, r.Step))
	case data != nil:
		s.err = guardOwn(func() error { return s.whole(b, data) })
	case r.Ref == nil:
		s.err = guardOwn(func() error { return s.consume(b) })
	case s.ref == nil:
		s.err = ownErr(fmt.Errorf("rank %d sent a reference in a message (space %d, step %d) that takes none", r.Src, r.Space, r.Step))
	default:
		// The bytes are read from the sender's mapping, under the guard:
		// a file truncated under it fails the message, not the process.
		s.err = guardOwn(func() error { return s.ref(b, c.refReaderFor(ctx, r.Src, r.Ref)) })
	}
	close(s.done)
	if isOwn(s.err) && r.Space != spaceP2P {
		// This rank cannot complete collective r.Seq. It breaks off now,
		// not when its collective comes to wait for this message: it may
		// be waiting for another that will never come (its sender fails
		// with this answer), and the others need to hear of it. The
		// sender hears the ErrAborted naming this rank.
		c.breakOff(r.Seq, s.err)
		return c.cause()
	}
	return s.err
}

// send sends b as message k to rank dst and returns once dst consumed it.
func (c *Comm) send(ctx context.Context, dst int, k msgKey, b []byte) error {
	return c.sendReq(ctx, dst, k, b, nil)
}

// sendReq is send with a reference (nil: none).
func (c *Comm) sendReq(ctx context.Context, dst int, k msgKey, b []byte, ref *p2pRef) error {
	return c.sendMsg(ctx, dst, k, b, nil, ref)
}

// wholeMax is the largest point-to-point message sent whole, its bytes
// beside its dtype and shape in one call (protocol 10), where it does not
// go by reference: above it, a receiver whose tensor does not fit learns
// so before the bytes travel.
const wholeMax = 64 << 10

// sendWhole sends point-to-point message k whole: its first piece m and
// its bytes data (key "d" of the message's TensorDict) in one call.
func (c *Comm) sendWhole(ctx context.Context, dst int, k msgKey, m, data []byte) error {
	return c.sendMsg(ctx, dst, k, m, data, nil)
}

// setBytes sets key of td to a uint8 tensor over b.
func setBytes(td *tensordict.TensorDict, key string, b []byte) error {
	t, err := tensordict.FromBytes(memmap.Uint8, []int{len(b)}, b)
	if err != nil {
		return err
	}
	return td.Set(key, t)
}

// sendMsg is sendReq, with data (not nil) the bytes of a whole message.
func (c *Comm) sendMsg(ctx context.Context, dst int, k msgKey, b, data []byte, ref *p2pRef) error {
	cl, err := c.client(ctx, dst)
	if err != nil {
		return c.lostErr(ctx, dst, err)
	}
	req := msgReq{Session: c.session, Src: c.rank, Space: k.space, Seq: k.seq, Tag: k.tag, Step: k.step, Piece: k.piece, Ref: ref}
	if len(b) > 0 {
		td, _ := tensordict.New()
		if err := setBytes(td, "b", b); err != nil {
			return err
		}
		if data != nil {
			if err := setBytes(td, "d", data); err != nil {
				return err
			}
		}
		req.Data = rpc.Ref(td)
	}
	// The bytes may be a mapping's (a caller's tensor or Into output,
	// sent where it is): rpc copies them into its connection's buffer in
	// this goroutine, and a fault there (the file truncated) is an error
	// of this rank's own that fails the message, and through it the
	// collective on every rank (failData), not the process. Every message
	// goes through here, from whichever goroutine sends it. It costs a
	// deferred recover and two SetPanicOnFault calls a message. A faulted
	// call leaves its rpc stream part-written: rpc closes it when ctx
	// ends, or with the client at Close (the communicator is broken).
	err = guardOwn(func() error {
		_, err := rpc.Call[rpc.Empty](ctx, cl, methodMsg, req)
		return err
	})
	if isOwn(err) {
		return err
	}
	if err != nil {
		if k.space != spaceP2P && errors.Is(err, rpc.ErrUnavailable) && c.closedAfter(ctx, dst, k.seq) {
			// dst completed this collective and closed: it had our
			// message; only the answer was lost with the connection.
			return nil
		}
		return c.lostErr(ctx, dst, err)
	}
	return nil
}

// closedAfter waits a little for news of rank j and reports whether it
// closed its communicator after completing collective seq.
func (c *Comm) closedAfter(ctx context.Context, j int, seq uint64) bool {
	deadline := time.Now().Add(2 * time.Second)
	for {
		if g := c.goneAt[j].Load(); g != 0 {
			return g-1 > seq
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lostErr turns a failed send to rank j into the error callers see.
func (c *Comm) lostErr(ctx context.Context, j int, err error) error {
	if e := c.err(); e != nil {
		return e
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, rpc.ErrUnavailable) && !errors.Is(err, ErrPeerLost) {
		return errorf(ErrPeerLost, "rank %d unreachable: %s", j, rpcMsg(err))
	}
	return err
}

// pieceBytes is the largest message: bigger ones go in pieces, several in
// flight at once, so the receiver consumes one while the next travels.
const pieceBytes = 1 << 20

func pieces(n int) int { return max(1, (n+pieceBytes-1)/pieceBytes) }

// sendBytes sends b to dst as the pieces of message k.
func (c *Comm) sendBytes(ctx context.Context, dst int, k msgKey, b []byte) error {
	np := pieces(len(b))
	if np == 1 {
		return c.send(ctx, dst, k, b)
	}
	errs := make(chan error, np)
	for p := range np {
		kp := k
		kp.piece = uint32(p)
		part := b[p*pieceBytes : min(len(b), (p+1)*pieceBytes)]
		go func() { errs <- c.send(ctx, dst, kp, part) }()
	}
	var first error
	for range np {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// postBytes posts the n bytes of message k from src, consumed piece by
// piece (off is the piece's offset), and returns a function that waits for
// them all. n < 0 takes one message of any length.
func (c *Comm) postBytes(src int, k msgKey, n int, consume func(off int, b []byte) error) func(ctx context.Context) error {
	np, any := pieces(n), n < 0
	if any {
		np = 1
	}
	type posted struct {
		k msgKey
		s *slot
	}
	ps := make([]posted, np)
	for p := range np {
		kp := k
		kp.piece = uint32(p)
		off, want := p*pieceBytes, min(n, (p+1)*pieceBytes)-p*pieceBytes
		ps[p] = posted{kp, c.box.post(kp, func(b []byte) error {
			if !any && len(b) != want {
				return ownErr(errorf(ErrMismatch, "rank %d sent %d bytes, rank %d expected %d", src, len(b), c.rank, want))
			}
			return consume(off, b)
		})}
	}
	return func(ctx context.Context) error {
		var first error
		for _, p := range ps {
			if err := c.box.wait(ctx, p.k, p.s); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
}
