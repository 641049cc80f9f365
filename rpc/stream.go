package rpc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// Message streams: a call that carries typed messages both ways on one
// yamux stream, for as long as the handler runs (docs/protocol.md,
// "Streams").
//
// The caller opens one with a request like a call's (its header says
// stream); then each side sends messages, each framed like a call's
// message (header, msgpack argument, body of tensor bytes), and ends its
// side with an end frame: the caller's says it sends no more (CloseSend),
// the handler's carries the handler's result, a status with a code, and
// follows its last message. Each side then closes its side of the yamux
// stream. A caller that gives up resets the yamux stream (RST), which the
// node sees at once however much it has buffered, and the handler's context
// ends; a node that dies fails the caller's Recv with Unavailable, as
// calls do (the client's watchdog covers streams too).
//
// Each side reads messages on a goroutine of its own, ahead of its
// receiver by at most Limits.MaxStreamBuffer bytes; past that it stops
// reading, the yamux window fills, and the sender's Send waits. A slow
// receiver thus slows its own sender and no other stream.
//
// This file holds what both sides share: msgStream (a side's queue, its
// reader, its writes, its end and abort) and the decoding of messages. The
// caller's half is in client_stream.go, the handler's in server_stream.go.

// recvAs receives a message of type M from ms.
func recvAs[M any](ctx context.Context, ms *msgStream) (M, error) {
	v, err := ms.recv(ctx)
	if err != nil {
		var zero M
		return zero, err
	}
	return *v.(*M), nil
}

// decodeMessage decodes a message of type M and builds its TDs, reading
// their bytes from body.
func decodeMessage[M any](ms *msgStream, args []byte, body *bodyReader) (any, *decoded, error) {
	m := new(M)
	if err := decodeMsgpack(args, m); err != nil {
		return nil, nil, Errorf(ms.badCode, "%s: message: %v", ms.method, err)
	}
	tds := findTDs(reflect.ValueOf(m).Elem(), nil)
	wires := make([]*wireTD, len(tds))
	for i, td := range tds {
		wires[i] = td.wire
	}
	if err := checkBody(wires, body.n); err != nil {
		return nil, nil, Errorf(ms.badCode, "%s: message: %s", ms.method, asError(err).Msg)
	}
	d := &decoded{pooled: ms.reuse.Load()}
	for _, td := range tds {
		if err := td.build(ms.res, body.fill, d); err != nil {
			return nil, d, err
		}
	}
	return m, d, nil
}

// msgStream is one side of a message stream: a caller's or a handler's.
type msgStream struct {
	method   string
	caller   bool // the caller's side
	st       *yamux.Stream
	fc       *frameConn
	br       *bufio.Reader
	bw       *bufio.Writer
	lim      *Limits
	bodies   *budget   // a node's: the peer's budget for bodies (budget.go); nil on the caller's side
	link     link      // how this side sends TDs
	res      *resolver // how it resolves references it receives; nil: it refuses them
	compress bool      // send bodies compressed when a sample pays
	badCode  Code      // of a message that does not decode
	decode   func(ms *msgStream, args []byte, body *bodyReader) (any, *decoded, error)

	// The side's ways of turning failures into errors: of a Send or Recv
	// whose ctx ended (ctxErr), of the reader's stream (readErr), and what
	// to do on a protocol violation (protocolErr).
	ctxErr      func(ctx context.Context, cause error) error
	readErr     func(err error) error
	protocolErr func(err error)

	sendMu sync.Mutex
	sent   bool // this side's end frame is written

	mu       sync.Mutex
	changed  chan struct{} // closed, and replaced, on every change below
	queue    []received    // messages read and not yet received
	queued   int64         // their bytes
	ended    bool          // no more messages will be queued
	end      error         // Recv's error once the queue is empty
	peerEnd  bool          // the peer's end frame arrived
	stopSend bool          // the handler ended: the caller's Sends return io.EOF
	discard  bool          // the receiver is gone: read and drop
	abortErr error         // this side reset the stream
	held     *decoded      // what the last message Recv returned holds

	readerDone chan struct{}
	stopCtx    func() bool // the caller's: stops cancelling on ctx

	reuse atomic.Bool // ReuseBuffers: messages' bytes-mode TDs in pooled memory, valid until the next Recv

	// The side connection the stream holds for its life (side.go), and
	// how it gives it back: ok when it is in step. Every frame after the
	// opening request goes on it, both ways (sideFrames, set once the
	// request is written or read).
	side         *sideConn
	putSide      func(sc *sideConn, ok bool)
	sideFrames   bool
	sideReleased bool // under mu
}

// received is a message read, or the error of one that did not decode.
type received struct {
	msg  any
	d    *decoded
	err  error
	size int64
}

func newMsgStream(method string, st *yamux.Stream, fc *frameConn, br *bufio.Reader, bw *bufio.Writer, lim *Limits) *msgStream {
	return &msgStream{method: method, st: st, fc: fc, br: br, bw: bw, lim: lim,
		changed: make(chan struct{}), readerDone: make(chan struct{}), stopCtx: func() bool { return true }}
}

// signal wakes everyone waiting for a change; ms.mu must be held.
func (ms *msgStream) signal() {
	close(ms.changed)
	ms.changed = make(chan struct{})
}

// finish records why no more messages will be queued, if nothing has yet.
func (ms *msgStream) finish(err error) {
	ms.mu.Lock()
	if !ms.ended {
		ms.ended, ms.end = true, err
		ms.signal()
	}
	ms.mu.Unlock()
}

// release ends the use of what a message's TDs hold.
func (ms *msgStream) release(d *decoded) {
	if d == nil {
		return
	}
	if ms.res != nil {
		for _, m := range d.held {
			ms.res.release(m)
		}
	}
	d.held = nil
	for _, bp := range d.bufs {
		putBuf(bp)
	}
	d.bufs = nil
}

// dropQueue releases the queued messages and the one last received; ms.mu
// must be held, and the returned function called without it.
func (ms *msgStream) dropQueue() func() {
	q, held := ms.queue, ms.held
	ms.queue, ms.queued, ms.held = nil, 0, nil
	return func() {
		for _, it := range q {
			ms.release(it.d)
		}
		ms.release(held)
	}
}

// readLoop reads the peer's frames into the queue until the peer's end, a
// failure, or the stream is aborted. sessDone is closed when the session
// ends.
func (ms *msgStream) readLoop(sessDone <-chan struct{}) {
	defer close(ms.readerDone)
	for {
		var h streamHeader
		err := readHeader(ms.br, ms.lim.MaxHeaderBytes, &h)
		if err == nil && h.End {
			ms.mu.Lock()
			ms.peerEnd = true
			if ms.caller {
				ms.stopSend = true
			}
			ms.mu.Unlock()
			ms.finish(h.status())
			if ms.caller {
				ms.st.Close() // the handler has ended: this side is done too
				// Both ends are written: the side connection is free, unless a
				// Send still holds it (then Close or endSend gives it back).
				if ms.sendMu.TryLock() {
					if ms.sent {
						ms.releaseSide(true)
					}
					ms.sendMu.Unlock()
				}
			}
			return
		}
		if err == nil {
			err = checkLens(h.ArgLen, h.BodyLen, ms.lim)
		}
		if err == nil {
			err = checkRaw(h.BodyLen, h.RawLen, ms.lim, true)
		}
		if err != nil {
			ms.fail(err)
			return
		}
		size := h.ArgLen + max(h.BodyLen, h.RawLen)
		if !ms.waitRoom(size, sessDone) {
			return
		}
		args, err := readArgs(ms.br, h.ArgLen)
		if err != nil {
			ms.fail(err)
			return
		}
		body := newBodyReader(ms.br, h.BodyLen, h.RawLen).corruptCode(ms.badCode)
		it := received{size: size}
		ms.mu.Lock()
		drop := ms.discard || ms.ended
		ms.mu.Unlock()
		// A node takes the message's size from the peer's budget before
		// its tensors are allocated, and gives it back once it is in.
		var took int64
		if !drop && ms.bodies != nil {
			if took = max(h.BodyLen, h.RawLen); !ms.bodies.take(took, sessDone) {
				ms.finish(ms.readErr(yamux.ErrSessionShutdown))
				return
			}
		}
		if !drop {
			it.msg, it.d, it.err = ms.decode(ms, args, body)
		}
		err = body.drain()
		if took > 0 {
			ms.bodies.give(took)
		}
		if err != nil {
			ms.release(it.d)
			ms.fail(err)
			return
		}
		if _, broken := errors.AsType[*streamError](it.err); broken {
			ms.release(it.d)
			ms.fail(it.err)
			return
		}
		if it.err != nil {
			ms.release(it.d)
			it.msg, it.d = nil, nil
		}
		ms.push(it, drop)
	}
}

// fail ends the reader on err, a failure of the stream or of the protocol.
func (ms *msgStream) fail(err error) {
	if errors.Is(err, errProtocol) {
		ms.protocolErr(err)
	}
	ms.finish(ms.readErr(err))
}

// waitRoom waits until a message of size bytes fits in the queue (or it is
// empty), and reports whether the reader should go on.
func (ms *msgStream) waitRoom(size int64, sessDone <-chan struct{}) bool {
	ms.mu.Lock()
	for !ms.discard && !ms.ended && len(ms.queue) > 0 && ms.queued+size > ms.lim.MaxStreamBuffer {
		ch := ms.changed
		ms.mu.Unlock()
		select {
		case <-ch:
		case <-sessDone:
			ms.finish(ms.readErr(yamux.ErrSessionShutdown))
			return false
		}
		ms.mu.Lock()
	}
	goOn := !ms.ended || ms.discard
	ms.mu.Unlock()
	return goOn
}

// push queues a message, unless it is dropped.
func (ms *msgStream) push(it received, drop bool) {
	ms.mu.Lock()
	if drop || ms.discard || ms.ended {
		ms.mu.Unlock()
		ms.release(it.d)
		return
	}
	ms.queue = append(ms.queue, it)
	ms.queued += it.size
	ms.signal()
	ms.mu.Unlock()
}

// recv returns the next message, or why there is none.
func (ms *msgStream) recv(ctx context.Context) (any, error) {
	msg, _, err := ms.receive(ctx, true)
	return msg, err
}

// recvHeld is recv whose message's TDs the caller releases, with
// ms.release of the returned *decoded (nil when there is nothing to
// release); the message recv returned before is released now.
func (ms *msgStream) recvHeld(ctx context.Context) (any, *decoded, error) {
	return ms.receive(ctx, false)
}

// receive returns the next message and what its TDs hold; with keep, ms
// holds that (ms.held, set as the message leaves the queue, so that
// dropQueue finds it in one place or the other) until the next receive,
// and the *decoded returned is nil.
func (ms *msgStream) receive(ctx context.Context, keep bool) (any, *decoded, error) {
	ms.mu.Lock()
	prev := ms.held
	ms.held = nil
	ms.mu.Unlock()
	ms.release(prev)
	for {
		ms.mu.Lock()
		if len(ms.queue) > 0 {
			it := ms.queue[0]
			ms.queue[0] = received{}
			ms.queue = ms.queue[1:]
			ms.queued -= it.size
			d := it.d
			if keep {
				ms.held, d = it.d, nil
			}
			ms.signal()
			ms.mu.Unlock()
			return it.msg, d, it.err
		}
		if ms.ended {
			err := ms.end
			ms.mu.Unlock()
			return nil, nil, err
		}
		ch := ms.changed
		ms.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, ms.ctxErr(ctx, ctx.Err())
		}
	}
}

// send writes one message.
func (ms *msgStream) send(ctx context.Context, msg any) error {
	if err := ctx.Err(); err != nil {
		return ms.ctxErr(ctx, err)
	}
	var parts []bodyPart
	tds := findTDs(reflect.ValueOf(msg).Elem(), nil)
	for _, td := range tds {
		if td.Out {
			return Errorf(InvalidArgument, "%s: a TD with Out in a stream message: nothing comes back", ms.method)
		}
		var err error
		if parts, err = td.prepare(ms.link, parts); err != nil {
			return err
		}
	}
	args, err := encodeMsgpack(msg)
	if err != nil {
		return Errorf(InvalidArgument, "%s: %w", ms.method, err)
	}
	compress := ms.compress && !isUncompressed(ctx)
	var body outBody
	if len(tds) == 1 && tds[0].Seal != nil && compress {
		body = tds[0].Seal.body(parts)
	} else {
		body = sealBody(parts, compress)
	}
	defer body.release()
	h := streamHeader{ArgLen: int64(len(args)), BodyLen: body.wireLen(), RawLen: body.rawLen()}

	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	if ms.sent {
		return Errorf(FailedPrecondition, "%s: Send after the end of this side's messages", ms.method)
	}
	if err := ms.unsendable(); err != nil {
		return err
	}
	return ms.write(ctx, &h, args, &body, false)
}

// unsendable returns why nothing can be sent, or nil.
func (ms *msgStream) unsendable() error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	switch {
	case ms.abortErr != nil:
		return ms.abortErr
	case ms.stopSend:
		return io.EOF
	}
	return nil
}

// write writes a frame under ms.sendMu, bounded by ctx: a write that ctx
// cuts short leaves part of a frame on the stream, which then aborts. With
// sideFrames the frame goes whole on the side connection, in one writev;
// else in the yamux stream, its body on the side connection if onSide (the
// opening request's).
func (ms *msgStream) write(ctx context.Context, h header, args []byte, body *outBody, onSide bool) error {
	stop := context.AfterFunc(ctx, func() {
		ms.st.SetWriteDeadline(time.Unix(1, 0))
		if onSide || ms.sideFrames {
			ms.side.conn.SetWriteDeadline(time.Unix(1, 0))
		}
	})
	var err error
	if ms.sideFrames {
		err = writeMessage(ms.side.conn, h, args, body)
	} else {
		err = writeFrame(ms.bw, h, args)
		if err == nil && body != nil && !onSide {
			err = body.write(ms.bw)
		}
		if err == nil {
			err = ms.bw.Flush()
		}
		if err == nil && onSide {
			// After the header: the peer reads the body once it has read that.
			err = writeBody(ms.side.conn, nil, body)
		}
	}
	if !stop() {
		cerr := ms.ctxErr(ctx, ctx.Err())
		ms.abort(cerr)
		return cerr
	}
	if err == nil {
		return nil
	}
	// The stream is out of step, or gone.
	if uerr := ms.unsendable(); uerr != nil {
		return uerr
	}
	var e *Error
	if errors.As(err, &e) {
		ms.abort(err)
		return err // a tensor could not be read
	}
	ms.mu.Lock()
	ended, end := ms.ended, ms.end
	ms.mu.Unlock()
	var werr error
	if !ms.caller && ended && end != io.EOF {
		werr = end // the caller went away
	} else {
		werr = ms.readErr(err)
	}
	ms.abort(werr)
	return werr
}

// endSend writes this side's end frame with status and closes its side of
// the yamux stream.
func (ms *msgStream) endSend(ctx context.Context, status error) error {
	ms.sendMu.Lock()
	defer ms.sendMu.Unlock()
	if ms.sent {
		return nil
	}
	ms.sent = true
	if err := ms.unsendable(); err != nil {
		// On a side connection the node reads the caller's frames until the
		// caller's end even after the handler has ended (there is no FIN
		// per stream there): the end is written then too, or the
		// connection, given back as in step, would stay held by the node
		// for TransferGrace.
		if err != io.EOF || !ms.caller || !ms.sideFrames {
			if err == io.EOF {
				return nil // the handler has ended: nothing to tell it
			}
			return err
		}
	}
	h := endHeader(status)
	err := ms.write(ctx, &h, nil, nil, false)
	ms.st.Close()
	if ms.caller {
		ms.mu.Lock()
		peerEnd := ms.peerEnd
		ms.mu.Unlock()
		if peerEnd {
			// The handler's end came first: its reader is done.
			<-ms.readerDone
			ms.releaseSide(err == nil)
		}
	}
	if err == io.EOF {
		return nil // the handler ended meanwhile
	}
	return err
}

// abort resets the stream: the peer's side fails at once, this side's
// Sends and Recvs return err.
func (ms *msgStream) abort(err error) {
	ms.mu.Lock()
	if ms.abortErr != nil {
		ms.mu.Unlock()
		return
	}
	ms.abortErr = err
	if !ms.ended {
		ms.ended, ms.end = true, err
	}
	release := ms.dropQueue()
	ms.signal()
	side := ms.side != nil && !ms.sideReleased
	ms.sideReleased = ms.sideReleased || side
	ms.mu.Unlock()
	release()
	if side {
		// Closed at once: a body's read or write on it fails, and the peer
		// sees it end (it is not reused).
		ms.side.kill()
	}
	ms.fc.reset(ms.st.StreamID())
	ms.st.Close()
	past := time.Unix(1, 0)
	ms.st.SetReadDeadline(past)
	ms.st.SetWriteDeadline(past)
}

// closeCaller is Stream.Close.
func (ms *msgStream) closeCaller() {
	ms.stopCtx()
	ms.mu.Lock()
	peerEnd, aborted := ms.peerEnd, ms.abortErr != nil
	ms.mu.Unlock()
	if !peerEnd && !aborted {
		ms.abort(&Error{Code: Canceled, Msg: ms.method + ": stream closed by the caller"})
	} else {
		ms.st.Close()
	}
	ms.fc.unwatch(ms.st.StreamID())
	// The side connection is in step if both ends were written whole and
	// the handler's was read; a Send in progress holds it still.
	ok := false
	if ms.sendMu.TryLock() {
		ok = ms.sent && peerEnd && !aborted
		ms.sendMu.Unlock()
	}
	if ok {
		<-ms.readerDone
	}
	ms.releaseSide(ok)
}

// releaseSide gives the stream's side connection back, once: to be reused
// if ok and the stream was not aborted, else closed. When ok, the reader
// is done (it read the peer's end frame) and what it read past that frame
// goes back with the connection: on a node, the caller's next request,
// which the caller may send as soon as both ends are through (a reader
// waiting for room reads it with the end); on a caller, bytes the node
// sent after its end, which put it out of step (the connection is closed).
func (ms *msgStream) releaseSide(ok bool) {
	ms.mu.Lock()
	if ms.side == nil || ms.sideReleased {
		ms.mu.Unlock()
		return
	}
	ms.sideReleased = true
	ok = ok && ms.abortErr == nil
	ms.mu.Unlock()
	if ok && ms.sideFrames && ms.br.Buffered() > 0 {
		if ms.caller {
			ok = false
		} else {
			rest, _ := ms.br.Peek(ms.br.Buffered())
			ms.side.unread(rest)
		}
	}
	ms.putSide(ms.side, ok)
}
