package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"runtime/debug"
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

// streamHandler decodes the open request of a message stream (reading its
// body), sets ms's message decoder, and returns the function that runs
// the handler.
type streamHandler func(in *incoming, ms *msgStream) (run func(ctx context.Context) error, err error)

// RegisterStream makes fn serve method as a message stream on s. The caller
// opens it with OpenStream and a Req; fn receives the caller's messages
// (In) with st.Recv and sends its own (Out) with st.Send, and the stream
// ends when fn returns: its error reaches the caller's Recv, after every
// message fn sent, as a call's error does (codes, reasons; a panic is
// Internal); nil reaches it as io.EOF.
//
// Req, In and Out are encoded with msgpack like a call's request and
// response, TD fields included: the caller's TDs travel by reference when
// the node shares its filesystem, else as bytes; fn's always as bytes.
//
// fn's context carries the caller's deadline and ends when the caller
// cancels the stream, closes it before the end, goes away, or the server
// is closed. TDs in req are valid until fn returns; see ServerStream.Recv
// for those of messages. Registering a method twice, as a call or a
// stream, is an error.
func RegisterStream[Req, In, Out any](s *Server, method string, fn func(ctx context.Context, req Req, st *ServerStream[In, Out]) error) error {
	h := func(in *incoming, ms *msgStream) (func(context.Context) error, error) {
		req := new(Req)
		if err := decodeMsgpack(in.args, req); err != nil {
			return nil, Errorf(InvalidArgument, "%s: %v", method, err)
		}
		in.req = req
		if err := in.buildTDs(findTDs(reflect.ValueOf(req).Elem(), nil)); err != nil {
			return nil, err
		}
		ms.decode = decodeMessage[In]
		st := &ServerStream[In, Out]{ms: ms}
		return func(ctx context.Context) (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = Errorf(Internal, "%s: handler panicked: %v", method, p)
					s.o.log.Error("rpc: stream handler panicked", "method", method, "panic", p, "stack", string(debug.Stack()))
				}
			}()
			return fn(ctx, *req, st)
		}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.registered(method) {
		return fmt.Errorf("rpc: method %q registered twice", method)
	}
	s.streams[method] = h
	return nil
}

// ServerStream is a handler's side of a message stream: it receives In
// messages from the caller and sends Out messages to it. It is valid until
// the handler returns. Send and Recv may be called from different
// goroutines at once; Recv from one goroutine at a time.
type ServerStream[In, Out any] struct{ ms *msgStream }

// Recv returns the caller's next message, waiting for it until ctx ends.
// It returns io.EOF when the caller has sent its last (Stream.CloseSend),
// and an error matching ErrCanceled when the caller cancelled the stream
// or went away (the handler's context has ended then too). A message that
// does not decode is an InvalidArgument error, and the stream goes on.
//
// The message's TDs that came as bytes are the handler's to keep (unless
// ReuseBuffers); those
// that came by reference are views of mappings that stay valid until the
// next Recv or until the handler returns.
func (s *ServerStream[In, Out]) Recv(ctx context.Context) (In, error) {
	return recvAs[In](ctx, s.ms)
}

// ReuseBuffers makes the TDs that come as bytes in the messages Recv
// returns from now on valid only until the next Recv or until the handler
// returns, as those that come by reference are: their memory is then
// reused for later messages, which saves a handler that consumes each
// message before the next (verifies it, reduces it into its own tensors)
// an allocation, and the garbage collector's work, per message.
func (s *ServerStream[In, Out]) ReuseBuffers() { s.ms.reuse.Store(true) }

// Send sends m to the caller. It blocks while the caller's side is full (the
// caller reads more slowly than the handler sends) until ctx ends; a Send
// cut short by ctx leaves part of a message on the stream, so the stream is
// reset and the caller's Recv fails. It fails when the caller has gone.
func (s *ServerStream[In, Out]) Send(ctx context.Context, m Out) error {
	return s.ms.send(ctx, &m)
}

// Stream is a caller's side of a message stream (OpenStream): it sends S
// messages to the handler and receives R messages from it. Send and Recv
// may be called from different goroutines at once; each from one
// goroutine at a time. Close it when done.
type Stream[S, R any] struct{ ms *msgStream }

// OpenStream opens a message stream to method on c's node with the opening
// request req, and returns at once: it does not wait for the node, whose
// refusal (no such method, too many streams) comes as Recv's error.
//
// ctx governs the whole stream: its deadline is the handler's, and when it
// ends the stream is cancelled (the handler's context ends, Send and Recv
// fail with Canceled or DeadlineExceeded). A node that speaks only
// protocol version 1 has no streams (FailedPrecondition).
func OpenStream[S, R, Req any](ctx context.Context, c *Client, method string, req Req) (*Stream[S, R], error) {
	bulk := holdsTD(reflect.TypeFor[S]()) || holdsTD(reflect.TypeFor[R]())
	ms, err := c.openStream(ctx, method, &req, decodeMessage[R], bulk)
	if err != nil {
		return nil, err
	}
	return &Stream[S, R]{ms: ms}, nil
}

// Send sends m to the handler. It blocks while the node's side is full
// (the handler reads more slowly than the caller sends) until ctx ends; a
// Send cut short by ctx cancels the stream, since part of a message may
// have been sent. It returns io.EOF once the handler has ended the stream
// (Recv returns how), and an error after CloseSend.
func (s *Stream[S, R]) Send(ctx context.Context, m S) error {
	return s.ms.send(ctx, &m)
}

// Recv returns the handler's next message, waiting for it until ctx ends
// (which leaves the stream as it was). After the handler's last message it
// returns io.EOF when the handler returned nil, else the handler's error;
// Unavailable when the node went away or could not be reached
// (WithKeepAlive); Canceled or DeadlineExceeded when the stream's context
// ended. A message's TDs are the caller's to keep (unless ReuseBuffers).
func (s *Stream[S, R]) Recv(ctx context.Context) (R, error) {
	return recvAs[R](ctx, s.ms)
}

// ReuseBuffers makes the TDs of the messages Recv returns from now on valid
// only until the next Recv or Close: their memory is then reused for later
// messages, which saves a caller that consumes each message before the
// next an allocation, and the garbage collector's work, per message.
func (s *Stream[S, R]) ReuseBuffers() { s.ms.reuse.Store(true) }

// CloseSend tells the handler the caller sends no more messages: its Recv
// returns io.EOF after the last one. The caller can go on receiving.
func (s *Stream[S, R]) CloseSend(ctx context.Context) error {
	return s.ms.endSend(ctx, nil)
}

// Close ends the caller's use of the stream. A stream the handler has not
// ended yet is cancelled: the handler's context ends. Close is idempotent,
// and safe to call at any time, also from another goroutine.
func (s *Stream[S, R]) Close() error {
	s.ms.closeCaller()
	return nil
}

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
			ms.held = it.d
			ms.signal()
			ms.mu.Unlock()
			return it.msg, it.err
		}
		if ms.ended {
			err := ms.end
			ms.mu.Unlock()
			return nil, err
		}
		ch := ms.changed
		ms.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ms.ctxErr(ctx, ctx.Err())
		}
	}
}

// send writes one message.
func (ms *msgStream) send(ctx context.Context, msg any) error {
	if err := ctx.Err(); err != nil {
		return ms.ctxErr(ctx, err)
	}
	var parts []bodyPart
	for _, td := range findTDs(reflect.ValueOf(msg).Elem(), nil) {
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
	body := sealBody(parts, ms.compress && !isUncompressed(ctx))
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
// if ok and the stream was not aborted, else closed.
func (ms *msgStream) releaseSide(ok bool) {
	ms.mu.Lock()
	if ms.side == nil || ms.sideReleased {
		ms.mu.Unlock()
		return
	}
	ms.sideReleased = true
	ok = ok && ms.abortErr == nil
	ms.mu.Unlock()
	ms.putSide(ms.side, ok)
}

// openStream opens a message stream (OpenStream); req is a pointer.
func (c *Client) openStream(ctx context.Context, method string, req any, decode func(*msgStream, []byte, *bodyReader) (any, *decoded, error), bulk bool) (*msgStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, transportError(ctx, method, err)
	}
	cc, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	if cc.version < 2 {
		return nil, Errorf(FailedPrecondition, "%s: the node speaks protocol version %d, which has no message streams", method, cc.version)
	}
	var parts []bodyPart
	for _, td := range findTDs(reflect.ValueOf(req).Elem(), nil) {
		if parts, err = td.prepare(cc.link, parts); err != nil {
			return nil, err
		}
	}
	args, err := encodeMsgpack(req)
	if err != nil {
		return nil, Errorf(InvalidArgument, "%s: %w", method, err)
	}
	compress := !c.o.noLZ4 && !isUncompressed(ctx)
	body := sealBody(parts, compress)
	defer body.release()
	hdr := requestHeader{Method: method, ArgLen: int64(len(args)), BodyLen: body.wireLen(), RawLen: body.rawLen(), Stream: true, NoLZ4: !compress}
	if deadline, ok := ctx.Deadline(); ok {
		hdr.TimeoutUS = max(int64(time.Until(deadline)/time.Microsecond), 1)
	}
	st, err := cc.sess.OpenStream()
	if err != nil {
		return nil, transportError(ctx, method, err)
	}
	ms := newMsgStream(method, st, cc.fc, bufio.NewReaderSize(st, 32<<10), bufio.NewWriterSize(frameWriter{st}, 32<<10), &c.o.limits)
	ms.caller, ms.link, ms.compress, ms.badCode, ms.decode = true, cc.link, compress, Internal, decode
	// A stream whose messages can hold TDs, or whose request is large,
	// holds a side connection for its life.
	if ms.side = cc.getSide(ctx, bulk || hdr.BodyLen >= sideMin); ms.side != nil {
		hdr.Side, hdr.SideBody = int64(ms.side.id), hdr.BodyLen >= sideMin
		ms.putSide = cc.side.put
	}
	ms.ctxErr = func(opCtx context.Context, cause error) error {
		if werr := cc.dog.err(opCtx, method, cause); werr != nil {
			return werr
		}
		return transportError(opCtx, method, cause)
	}
	ms.readErr = func(err error) error {
		if ctx.Err() != nil {
			return transportError(ctx, method, ctx.Err())
		}
		if werr := cc.dog.err(ctx, method, err); werr != nil {
			return werr
		}
		if err == io.EOF {
			// Not io.EOF itself: a Recv loop takes that for the handler's end.
			return &Error{Code: Unavailable, Msg: method + ": the node closed the stream without ending it", err: io.ErrUnexpectedEOF}
		}
		return transportError(ctx, method, err)
	}
	ms.protocolErr = func(err error) { ms.abort(Errorf(Internal, "%s: %w", method, err)) }
	cc.fc.watch(st.StreamID(), func(flags uint16) {
		ms.mu.Lock()
		ms.stopSend = true // the handler has ended, or the node reset the stream
		ms.mu.Unlock()
		if flags&yamuxFlagRST != 0 {
			ms.finish(&Error{Code: Unavailable, Msg: method + ": the node reset the stream"})
		}
	})
	ms.sendMu.Lock()
	err = ms.write(ctx, &hdr, args, &body, hdr.SideBody)
	if ms.side != nil {
		// From here on every frame goes on the side connection, both ways.
		ms.sideFrames, ms.br = true, bufio.NewReaderSize(ms.side, 32<<10)
	}
	ms.sendMu.Unlock()
	if err != nil {
		ms.abort(err)
		cc.fc.unwatch(st.StreamID())
		ms.releaseSide(false)
		return nil, err
	}
	go ms.readLoop(cc.sess.CloseChan())
	ms.stopCtx = context.AfterFunc(ctx, func() { ms.abort(transportError(ctx, method, ctx.Err())) })
	return ms, nil
}

// serveMessageStream serves the message stream that the request hdr opened
// on st (its argument read, its body not yet), until the handler returns
// and the caller has ended its side or TransferGrace has passed.
func (s *Server) serveMessageStream(pc *peerConn, st *yamux.Stream, br *bufio.Reader, bw *bufio.Writer, hdr *requestHeader, in *incoming, over bool, refused error, side *sideConn, log *slog.Logger) {
	lim := &s.o.limits
	defer in.release()
	n := pc.msgs.Add(1)
	defer pc.msgs.Add(-1)
	ms := newMsgStream(hdr.Method, st, pc.fc, br, bw, lim)
	ms.res, ms.compress, ms.badCode, ms.bodies = s.res, in.compress, InvalidArgument, pc.bodies
	if side != nil {
		ms.side, ms.putSide = side, pc.side.put
	}
	// Whatever happens, the side connection is given back (closed unless
	// the stream ended cleanly) when the stream is done.
	defer func() {
		ms.mu.Lock()
		ok := ms.peerEnd && ms.sent && ms.abortErr == nil
		ms.mu.Unlock()
		ms.releaseSide(ok)
	}()
	var run func(context.Context) error
	var err error
	switch {
	case refused != nil:
		err = refused
	case over:
		err = Errorf(ResourceExhausted, "more than %d concurrent calls from this peer", lim.MaxStreamsPerPeer)
	case n > int32(lim.MaxMessageStreams):
		err = Errorf(ResourceExhausted, "more than %d message streams from this peer", lim.MaxMessageStreams)
	default:
		run, err = s.decodeStream(in, ms)
	}
	if derr := in.body.drain(); derr != nil {
		return
	}
	if _, broken := errors.AsType[*streamError](err); broken {
		return
	}
	st.SetReadDeadline(time.Time{})
	if side != nil {
		// The opening request's body is read: every frame from here on
		// goes on the side connection, both ways.
		side.conn.SetReadDeadline(time.Time{})
		ms.sideFrames, ms.br = true, bufio.NewReaderSize(side, 32<<10)
	}

	ctx, cancel := callContext(context.WithValue(s.ctx, peerSharingKey{}, pc.level), hdr.TimeoutUS)
	defer cancel()
	gone := func() error {
		return &Error{Code: Canceled, Msg: hdr.Method + ": the caller cancelled the stream or went away"}
	}
	ms.ctxErr = func(opCtx context.Context, cause error) error { return transportError(opCtx, hdr.Method, cause) }
	ms.readErr = func(error) error {
		cancel()
		return gone()
	}
	ms.protocolErr = func(err error) {
		log.Warn("rpc: closing connection", "err", err)
		pc.sess.Close()
	}
	id := st.StreamID()
	pc.fc.watch(id, func(flags uint16) {
		if flags&yamuxFlagRST != 0 {
			ms.finish(gone())
			cancel()
		}
	})
	defer pc.fc.unwatch(id)
	// The session's end ends the handler's context even while the reader
	// waits for room rather than reading.
	stopSess := make(chan struct{})
	defer close(stopSess)
	go func() {
		select {
		case <-pc.sess.CloseChan():
			cancel()
		case <-stopSess:
		}
	}()

	if err != nil {
		ms.discard = true
	}
	go ms.readLoop(pc.sess.CloseChan())
	if err == nil {
		err = run(ctx)
	}
	if err != nil {
		if e := asError(err); e.Code == Unknown || e.Code == Internal {
			log.Warn("rpc: stream failed", "method", hdr.Method, "err", err)
		}
	}
	// The handler's end: its status after its last message; then drop what
	// the caller still sends until its own end, for at most TransferGrace.
	wctx, wcancel := context.WithTimeout(context.Background(), lim.TransferGrace)
	ms.endSend(wctx, err)
	wcancel()
	s.observe(in, CodeOf(err), 0, true)
	ms.mu.Lock()
	ms.discard = true
	release := ms.dropQueue()
	ms.signal()
	ms.mu.Unlock()
	release()
	st.SetReadDeadline(lim.transferDeadline(time.Now(), 0))
	if ms.sideFrames {
		side.conn.SetReadDeadline(lim.transferDeadline(time.Now(), 0))
	}
	<-ms.readerDone
	ms.mu.Lock()
	release = ms.dropQueue()
	ms.mu.Unlock()
	release()
}

// decodeStream looks up a message stream's method and decodes its opening
// request, as decode does for calls.
func (s *Server) decodeStream(in *incoming, ms *msgStream) (run func(context.Context) error, err error) {
	s.mu.RLock()
	h, call := s.streams[in.method], s.handlers[in.method] != nil
	s.mu.RUnlock()
	if h == nil {
		if call {
			return nil, Errorf(FailedPrecondition, "%q is a call, not a message stream", in.method)
		}
		return nil, Errorf(Unimplemented, "no method %q", in.method)
	}
	defer func() {
		if p := recover(); p != nil {
			run, err = nil, Errorf(Internal, "%s: decoding the stream's request panicked: %v", in.method, p)
			s.o.log.Error("rpc: decode panicked", "method", in.method, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	in.known = true
	return h(in, ms)
}
