package rpc

import (
	"bufio"
	"context"
	"io"
	"reflect"
	"sync"
	"time"
)

// The caller's half of a message stream: Stream, OpenStream, and the
// client's opening of one (Client.openStream). The half both sides share
// (msgStream: its queue, reader, writes, end and abort) is in stream.go;
// the handler's half in server_stream.go.

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

// RecvHeld is Recv for a caller that is done with a message only after its
// next Recv, as one that hands messages to another goroutine is: the
// message's TDs stay valid until release is called, not until the next
// Recv. release then lets go of what they hold: with ReuseBuffers, the
// memory of those that came as bytes, reused for later messages; the
// mappings of those that came by reference. release may be called from any
// goroutine, and more than once (the calls after the first do nothing); a
// message never released keeps its mappings mapped and its memory out of
// the reuse. Without ReuseBuffers the bytes-mode TDs are the caller's to
// keep. release is never nil.
func (s *Stream[S, R]) RecvHeld(ctx context.Context) (m R, release func(), err error) {
	v, d, err := s.ms.recvHeld(ctx)
	release = func() {}
	if d != nil {
		release = sync.OnceFunc(func() { s.ms.release(d) })
	}
	if err != nil {
		release()
		return m, func() {}, err
	}
	return *v.(*R), release, nil
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
