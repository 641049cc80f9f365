package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"time"

	"github.com/hashicorp/yamux"
)

// The handler's half of a message stream: RegisterStream, ServerStream,
// and the node's serving of one that a request opens on a stream of calls
// (Server.serveMessageStream). The half both sides share (msgStream) is in
// stream.go; the caller's half in client_stream.go.

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
		if err := in.buildTDs(findTDs(reflect.ValueOf(req).Elem(), nil), nil); err != nil {
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

// streamOpening is a request that opens a message stream, as serveStream
// hands it to serveMessageStream: the stream of calls it came on, the
// request read up to its body, and what serveStream decided about it.
type streamOpening struct {
	pc  *peerConn
	st  *yamux.Stream // the stream of calls, which carries this message stream and nothing after it
	br  *bufio.Reader // st's, buffered: the opening request's body follows in it (unless on side)
	bw  *bufio.Writer // st's
	log *slog.Logger  // the peer's

	hdr     *requestHeader
	in      *incoming // the opening request: its argument read, its body not yet
	over    bool      // the peer has more than MaxStreamsPerPeer streams open: refused
	refused error     // a refusal serveStream decided (a side body it cannot read, the body budget); nil: none
	side    *sideConn // the side connection the caller holds for the stream; nil: none
}

// serveMessageStream serves the message stream that the request op.hdr
// opened on op.st (its argument read, its body not yet), until the handler
// returns and the caller has ended its side or TransferGrace has passed.
func (s *Server) serveMessageStream(op *streamOpening) {
	lim := &s.o.limits
	defer op.in.release()
	n := op.pc.msgs.Add(1)
	defer op.pc.msgs.Add(-1)
	ms := newMsgStream(op.hdr.Method, op.st, op.pc.fc, op.br, op.bw, lim)
	// Its messages' references are resolved as a call's are: none from a
	// peer below Coherent (resolverFor).
	ms.res, ms.compress, ms.badCode, ms.bodies = s.resolverFor(op.pc.level), op.in.compress, InvalidArgument, op.pc.bodies
	if op.side != nil {
		ms.side, ms.putSide = op.side, op.pc.side.put
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
	case op.refused != nil:
		err = op.refused
	case op.over:
		err = Errorf(ResourceExhausted, "more than %d concurrent calls from this peer", lim.MaxStreamsPerPeer)
	case n > int32(lim.MaxMessageStreams):
		err = Errorf(ResourceExhausted, "more than %d message streams from this peer", lim.MaxMessageStreams)
	default:
		run, err = s.decodeStream(op.in, ms)
	}
	if derr := op.in.body.drain(); derr != nil {
		return
	}
	if _, broken := errors.AsType[*streamError](err); broken {
		return
	}
	op.st.SetReadDeadline(time.Time{})
	if op.side != nil {
		// The opening request's body is read: every frame from here on
		// goes on the side connection, both ways.
		op.side.conn.SetReadDeadline(time.Time{})
		ms.sideFrames, ms.br = true, bufio.NewReaderSize(op.side, 32<<10)
	}

	ctx, cancel := callContext(context.WithValue(s.ctx, peerSharingKey{}, op.pc.level), op.hdr.TimeoutUS)
	defer cancel()
	gone := func() error {
		return &Error{Code: Canceled, Msg: op.hdr.Method + ": the caller cancelled the stream or went away"}
	}
	ms.ctxErr = func(opCtx context.Context, cause error) error { return transportError(opCtx, op.hdr.Method, cause) }
	ms.readErr = func(error) error {
		cancel()
		return gone()
	}
	ms.protocolErr = func(err error) {
		op.log.Warn("rpc: closing connection", "err", err)
		op.pc.sess.Close()
	}
	id := op.st.StreamID()
	op.pc.fc.watch(id, func(flags uint16) {
		if flags&yamuxFlagRST != 0 {
			ms.finish(gone())
			cancel()
		}
	})
	defer op.pc.fc.unwatch(id)
	// The session's end ends the handler's context even while the reader
	// waits for room rather than reading.
	stopSess := make(chan struct{})
	defer close(stopSess)
	go func() {
		select {
		case <-op.pc.sess.CloseChan():
			cancel()
		case <-stopSess:
		}
	}()

	if err != nil {
		ms.discard = true
	}
	go ms.readLoop(op.pc.sess.CloseChan())
	if err == nil {
		err = run(ctx)
	}
	if err != nil {
		if e := asError(err); e.Code == Unknown || e.Code == Internal {
			op.log.Warn("rpc: stream failed", "method", op.hdr.Method, "err", err)
		}
	}
	// The handler's end: its status after its last message; then drop what
	// the caller still sends until its own end, for at most TransferGrace.
	wctx, wcancel := context.WithTimeout(context.Background(), lim.TransferGrace)
	ms.endSend(wctx, err)
	wcancel()
	s.observe(op.in, CodeOf(err), 0, true)
	ms.mu.Lock()
	ms.discard = true
	release := ms.dropQueue()
	ms.signal()
	ms.mu.Unlock()
	release()
	op.st.SetReadDeadline(lim.transferDeadline(time.Now(), 0))
	if ms.sideFrames {
		op.side.conn.SetReadDeadline(lim.transferDeadline(time.Now(), 0))
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
