package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Point-to-point messages: a tensor from one rank to another, matched by
// the pair of ranks and a tag, in the order they were sent (MPI's
// non-overtaking rule). They travel over the ranks' rpc connections on
// every transport, with their dtype and shape, so a receive into a tensor
// of another dtype or shape fails on both sides (ErrMismatch). Between
// ranks that share a folder (shared mappings, or host-mates of a
// hierarchy) a message of Config.ShmSendMin bytes or more carries a
// reference instead of its bytes, which the receiver copies out of the
// sender's mapping (p2p_shm.go). A send completes when the receiver has
// the bytes (MPI's synchronous mode): pair every Send with a Recv, or use
// Isend and Irecv to run both at once. They do not break the
// communicator when they fail.

// Request is a point-to-point operation in flight (Isend, Irecv). Its
// methods are safe for concurrent use.
type Request struct {
	c      *Comm
	done   chan struct{}
	err    error
	t      *tensordict.Tensor
	mu     sync.Mutex
	waited bool
	run    func() // the operation, until started (start, finish)

	// what the adjoint needs
	send bool
	peer int
	tag  int
}

// Wait waits for the operation to complete and returns its error; a
// receive's tensor is then filled (Tensor). ctx bounds the wait, not the
// operation (the Isend or Irecv context does). A second Wait returns
// ErrWaited.
func (r *Request) Wait(ctx context.Context) error {
	r.mu.Lock()
	if r.waited {
		r.mu.Unlock()
		return errorf(ErrWaited, "rank %d: %s with rank %d, tag %d", r.c.rank, r.what(), r.peer, r.tag)
	}
	r.waited = true
	r.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		r.mu.Lock()
		r.waited = false // it can be waited for again
		r.mu.Unlock()
		return ctx.Err()
	}
}

// Tensor returns the tensor the request sends or receives into.
func (r *Request) Tensor() *tensordict.Tensor { return r.t }

func (r *Request) what() string {
	if r.send {
		return "Isend"
	}
	return "Irecv"
}

// meta encodes a tensor's dtype and shape.
func meta(dt memmap.DType, shape []int) []byte {
	b := []byte{byte(dt)}
	for _, s := range shape {
		b = binary.LittleEndian.AppendUint64(b, uint64(s))
	}
	return b
}

func (c *Comm) p2pArgs(t *tensordict.Tensor, peer int, what string) error {
	if t == nil {
		return argumentf("%s on rank %d: no tensor", what, c.rank)
	}
	if peer < 0 || peer >= c.size {
		return argumentf("%s on rank %d: rank %d is not in [0, %d)", what, c.rank, peer, c.size)
	}
	return c.err()
}

// Isend starts sending t to rank dest with tag; t must not change until
// the request completes. ctx bounds the send.
func (c *Comm) Isend(ctx context.Context, t *tensordict.Tensor, dest, tag int) *Request {
	return c.isend(ctx, t, dest, tag).start()
}

// isend is Isend with its operation not started (Request.run).
func (c *Comm) isend(ctx context.Context, t *tensordict.Tensor, dest, tag int) *Request {
	r := &Request{c: c, done: make(chan struct{}), t: t, send: true, peer: dest, tag: tag}
	if r.err = c.p2pArgs(t, dest, "Isend"); r.err != nil {
		close(r.done)
		return r
	}
	b, err := t.Bytes()
	if err != nil {
		r.err = err
		close(r.done)
		return r
	}
	c.p2pMu.Lock()
	key := p2pKey{dest, tag}
	seq := c.sendSeq[key]
	c.sendSeq[key]++
	c.p2pMu.Unlock()
	// The message's first piece is the dtype and shape; the bytes follow
	// as a second message, so that a mismatch is found before they move.
	m := meta(t.DType(), t.Shape())
	r.run = func() {
		defer close(r.done)
		// The send ends when the communicator breaks, as a receive does
		// (its mailbox fails): its call may wait on a peer that will never
		// answer it, such as a peer that closed and is joining a new
		// communicator on the same address, which answers once this rank
		// joins too (TestNetns_HierRankKilled, p2p-ring: a hang).
		ctx, release := c.untilBroken(ctx)
		defer release()
		k := msgKey{src: c.rank, space: spaceP2P, seq: seq, tag: int64(tag)}
		// To a rank that shares a folder, a large message is one piece:
		// the dtype and shape with a reference to the bytes (p2p_shm.go).
		if sent, err := c.sendByRef(ctx, dest, k, m, b); sent {
			r.err = err
			return
		}
		// A small one is one call too (protocol 10): the bytes beside
		// the dtype and shape.
		if len(b) > 0 && len(b) <= wholeMax {
			if r.err = c.sendWhole(ctx, dest, k, m, b); r.err == nil {
				c.p2pStat.whole.Add(1)
			}
			return
		}
		if r.err = c.send(ctx, dest, k, m); r.err != nil {
			return
		}
		k.step = 1
		r.err = c.sendBytes(ctx, dest, k, b)
	}
	return r
}

// start runs the request's operation in a goroutine of its own (Isend,
// Irecv); Send and Recv run it in theirs (finish).
func (r *Request) start() *Request {
	if run := r.run; run != nil {
		r.run = nil
		go run()
	}
	return r
}

// Irecv starts receiving into t (of the sender's dtype and shape) from
// rank src with tag. ctx bounds the receive.
func (c *Comm) Irecv(ctx context.Context, t *tensordict.Tensor, src, tag int) *Request {
	return c.irecv(ctx, t, src, tag).start()
}

// irecv is Irecv with its operation not started (Request.run).
func (c *Comm) irecv(ctx context.Context, t *tensordict.Tensor, src, tag int) *Request {
	r := &Request{c: c, done: make(chan struct{}), t: t, peer: src, tag: tag}
	if r.err = c.p2pArgs(t, src, "Irecv"); r.err != nil {
		close(r.done)
		return r
	}
	b, err := t.Bytes()
	if err != nil {
		r.err = err
		close(r.done)
		return r
	}
	c.p2pMu.Lock()
	key := p2pKey{src, tag}
	seq := c.recvSeq[key]
	c.recvSeq[key]++
	c.p2pMu.Unlock()
	k := msgKey{src: src, space: spaceP2P, seq: seq, tag: int64(tag)}
	want := meta(t.DType(), t.Shape())
	check := func(m []byte) error {
		if !slices.Equal(m, want) {
			return mismatchf("rank %d sent %s to rank %d (tag %d), which receives %s", src, describeMeta(m), c.rank, tag, describeMeta(want))
		}
		return nil
	}
	// The first piece: the dtype and shape, and the bytes with it when
	// they come by reference or whole (then one is set before the slot is
	// done).
	byRef, one := false, false
	whole := func(m, data []byte) error {
		if err := check(m); err != nil {
			return err
		}
		if len(data) != len(b) {
			return mismatchf("rank %d sent %d bytes to rank %d (tag %d), which receives %d", src, len(data), c.rank, tag, len(b))
		}
		copy(b, data)
		one = true
		return nil
	}
	s := c.box.postRef(k, check, func(m []byte, rd refReader) error {
		if err := check(m); err != nil {
			return err
		}
		got := 0
		err := rd(func(off int, data []byte) error {
			if off+len(data) > len(b) {
				return mismatchf("rank %d sent more than %d bytes to rank %d (tag %d)", src, len(b), c.rank, tag)
			}
			got += copy(b[off:], data)
			return nil
		})
		if err == nil && got != len(b) {
			err = mismatchf("rank %d sent %d bytes to rank %d (tag %d), which receives %d", src, got, c.rank, tag, len(b))
		}
		byRef = err == nil
		return err
	}, whole)
	r.run = func() {
		defer close(r.done)
		if r.err = c.box.wait(ctx, k, s); r.err != nil || byRef || one {
			return
		}
		k.step = 1
		r.err = c.postBytes(src, k, len(b), into(b))(ctx)
	}
	return r
}

func describeMeta(m []byte) string {
	if len(m) < 1 || (len(m)-1)%8 != 0 {
		return "a malformed tensor"
	}
	shape := make([]int, (len(m)-1)/8)
	for i := range shape {
		shape[i] = int(binary.LittleEndian.Uint64(m[1+8*i:]))
	}
	return fmt.Sprintf("%s %v", memmap.DType(m[0]).Name(), shape)
}

// Send sends t to rank dest with tag and returns once dest has it.
//
// When ctx ends first, Send returns once the send has let go of t (it
// ends with ctx), not before: the caller may change t as soon as Send
// returns, which Isend(ctx).Wait(ctx) would not promise (its Wait ends
// with ctx at once).
func (c *Comm) Send(ctx context.Context, t *tensordict.Tensor, dest, tag int) error {
	return c.isend(ctx, t, dest, tag).finish()
}

// finish runs the operation in this goroutine when it has not started,
// or waits for it, which ends with its context.
func (r *Request) finish() error {
	r.mu.Lock()
	r.waited = true
	r.mu.Unlock()
	if run := r.run; run != nil {
		r.run = nil
		run()
	}
	<-r.done
	return r.err
}

// Recv receives into t from rank src with tag. When ctx ends first, Recv
// returns once nothing writes t any more, as Send.
func (c *Comm) Recv(ctx context.Context, t *tensordict.Tensor, src, tag int) error {
	return c.irecv(ctx, t, src, tag).finish()
}
