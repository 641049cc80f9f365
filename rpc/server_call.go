package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"reflect"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/yamux"
)

// Serving calls: Register, a call as read (incoming) and as answered
// (outgoing), and the serving of one yamux stream of calls, one after
// another (Server.serveStream): read the request, decode it, run the
// handler, write the answer (respond). A request that opens a message
// stream hands the stream to server_stream.go; calls on side connections
// are read in server_side.go and answered by the same decode and respond.

// handler decodes a call (reading its body) and returns the function that
// runs it. The decode step runs on the stream's reader; run runs
// concurrently with the reader watching the stream for the caller leaving.
type handler func(in *incoming) (run func(ctx context.Context) (out outgoing, err error), err error)

// incoming is a call as read from the stream.
type incoming struct {
	method string
	args   []byte
	body   *bodyReader
	res    *resolver
	held   []*mapping
	bufs   []*[]byte // pooled buffers of the arguments' tensors
	placed []placed  // the arguments' TDs laid out in folders (PlaceBytes)

	compress bool // the answer's body may be compressed

	bodies *budget // the peer's budget, and what this call took of it
	took   int64

	// For the server's Observer (observe.go).
	start  time.Time // the request's header read
	bodyIn int64     // the body's bytes on the wire
	req    any       // the decoded request, a *Req
	known  bool      // the method has a handler
}

// outgoing is a handler's result: the response value (a pointer) and the
// body parts that follow it.
type outgoing struct {
	resp    any
	parts   []bodyPart
	release []func() // the response TDs' Release
}

// done calls the response TDs' Release, once the body is written or given
// up. A Release that panics is logged, as a handler that panics is, and
// the connection goes on serving; the others still run.
func (o *outgoing) done(log *slog.Logger, method string) {
	for _, f := range o.release {
		func() {
			defer func() {
				if p := recover(); p != nil {
					log.Error("rpc: a response TD's Release panicked", "method", method, "panic", p, "stack", string(debug.Stack()))
				}
			}()
			f()
		}()
	}
	o.release = nil
}

// Register makes fn callable as method on s. Req and Resp are encoded with
// msgpack (exported fields; `codec:"name"` tags rename them); TD fields in
// them carry TensorDicts (see TD). The error fn returns reaches the caller
// with the code CodeOf gives it, and with its reason when it matches a
// sentinel registered with RegisterReason; return an *Error (Errorf) to
// choose the code. A panic in fn is recovered and reported as Internal.
//
// fn's context carries the caller's deadline and ends when the caller
// cancels, goes away, or the server is closed. Registering a method twice
// is an error, and so is an option made for another Req (PlaceBytes).
func Register[Req, Resp any](s *Server, method string, fn func(ctx context.Context, req Req) (Resp, error), opts ...RegisterOption) error {
	place, err := placeFunc[Req](method, opts)
	if err != nil {
		return err
	}
	h := func(in *incoming) (func(context.Context) (outgoing, error), error) {
		req := new(Req)
		if err := decodeMsgpack(in.args, req); err != nil {
			return nil, Errorf(InvalidArgument, "%s: %v", method, err)
		}
		in.req = req
		tds := findTDs(reflect.ValueOf(req).Elem(), nil)
		var where func(*TD, Layout) (Placement, error)
		if place != nil {
			where = func(td *TD, l Layout) (Placement, error) { return place(req, td, l) }
		}
		if err := in.buildTDs(tds, where); err != nil {
			return nil, err
		}
		return func(ctx context.Context) (out outgoing, err error) {
			defer func() {
				if p := recover(); p != nil {
					err = Errorf(Internal, "%s: handler panicked: %v", method, p)
					s.o.log.Error("rpc: handler panicked", "method", method, "panic", p, "stack", string(debug.Stack()))
				}
			}()
			resp, err := fn(ctx, *req)
			respTDs := findTDs(reflect.ValueOf(&resp).Elem(), nil)
			for _, td := range respTDs {
				if td.Release != nil {
					out.release = append(out.release, td.Release)
				}
			}
			if err != nil {
				return out, err
			}
			for _, td := range tds {
				out.parts = append(out.parts, td.writeback()...)
			}
			for _, td := range respTDs {
				if out.parts, err = td.prepare(link{}, out.parts); err != nil {
					return out, err
				}
			}
			out.resp = &resp
			return out, nil
		}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.registered(method) {
		return fmt.Errorf("rpc: method %q registered twice", method)
	}
	s.handlers[method] = h
	return nil
}

// registered reports whether method has a handler, of a call or of a
// message stream. s.mu must be held.
func (s *Server) registered(method string) bool {
	_, call := s.handlers[method]
	_, stream := s.streams[method]
	return call || stream
}

// buildTDs makes the request's TensorDicts, after checking that the body
// holds exactly the bytes they need. where, if set, says where to place a
// TD's bytes (PlaceBytes).
func (in *incoming) buildTDs(tds []*TD, where func(*TD, Layout) (Placement, error)) error {
	wires := make([]*wireTD, len(tds))
	for i, td := range tds {
		wires[i] = td.wire
	}
	if err := checkBody(wires, in.body.n); err != nil {
		return err
	}
	d := &decoded{pooled: true}
	defer func() { in.held, in.bufs, in.placed = d.held, d.bufs, d.placed }()
	for _, td := range tds {
		if where != nil {
			if l, ok := td.wire.layout(); ok {
				p, err := where(td, l)
				if err != nil {
					return err
				}
				if p.Prefix != "" {
					done, err := in.place(td, l, p, d)
					if err != nil {
						return err
					}
					if done {
						continue
					}
				}
			}
		}
		if err := td.build(in.res, in.body.fill, d); err != nil {
			return err
		}
	}
	return nil
}

// release ends the call's use of mappings.
func (in *incoming) release() {
	for _, m := range in.held {
		in.res.release(m)
	}
	in.held = nil
	for _, bp := range in.bufs {
		putBuf(bp)
	}
	in.bufs = nil
	releasePlaced(in.placed)
	in.placed = nil
	if in.bodies != nil {
		in.bodies.give(in.took)
		in.bodies, in.took = nil, 0
	}
}

// serveStream serves the calls that arrive on st, one after another, until
// the peer closes it, it idles out, or the peer breaks the protocol (then
// the whole connection is closed); over: the peer has more than
// MaxStreamsPerPeer streams open, and st serves one refusal. Each call is
// read (readRequest), then served (serveCall), or, when it opens a message
// stream, st carries that stream and nothing after it.
func (s *Server) serveStream(pc *peerConn, st *yamux.Stream, over bool, log *slog.Logger) {
	defer st.Close()
	defer func() {
		pc.active.Add(-1)
		select {
		case pc.room <- struct{}{}:
		default:
		}
	}()
	br := bufio.NewReaderSize(st, 32<<10)
	bw := bufio.NewWriterSize(frameWriter{st}, 32<<10)
	lim := &s.o.limits
	if over {
		// A stream over the limit serves one refusal: it may not wait long
		// for it, or a peer could hold any number of them open.
		st.SetReadDeadline(lim.transferDeadline(time.Now(), 0))
	} else {
		st.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
	}
	for {
		r, ok := s.readRequest(pc, st, br, over, log)
		if !ok {
			return
		}
		if r.hdr.Stream {
			s.serveMessageStream(&streamOpening{pc: pc, st: st, br: br, bw: bw, log: log,
				hdr: &r.hdr, in: r.in, over: over, refused: r.refused, side: r.side})
			return
		}
		if !s.serveCall(pc, st, bw, r, over, log) || over {
			return // out of step, refused, or the caller has left
		}
		st.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
	}
}

// request is a call's request as readRequest leaves it: its header, its
// argument read and its body not yet, the side connection the caller holds
// for it, and a refusal decided before any handler runs.
type request struct {
	hdr     requestHeader
	in      *incoming
	side    *sideConn // nil: none
	refused error     // a side body this call cannot read, the body budget; nil: none
}

// readRequest reads the next request on st: the header and its checks, the
// side connection it names, the argument, where the body comes from, and
// the body's share of the peer's budget. ok false: st is done, the peer
// closed it, it idled out or the peer broke the protocol, which closes the
// whole connection.
func (s *Server) readRequest(pc *peerConn, st *yamux.Stream, br *bufio.Reader, over bool, log *slog.Logger) (r *request, ok bool) {
	lim := &s.o.limits
	r = &request{}
	hdr := &r.hdr
	err := readHeader(br, lim.MaxHeaderBytes, hdr)
	start := time.Now()
	if err == nil {
		err = checkLens(hdr.ArgLen, hdr.BodyLen, lim)
	}
	if err == nil {
		err = checkRaw(hdr.BodyLen, hdr.RawLen, lim, pc.version >= 2)
	}
	if err == nil && hdr.Stream && pc.version < 2 {
		err = fmt.Errorf("%w: a message stream on a protocol version 1 connection", errProtocol)
	}
	if err == nil {
		err = checkSide(hdr.Side, hdr.SideBody, pc.version)
	}
	if err != nil {
		if errors.Is(err, errProtocol) {
			log.Warn("rpc: closing connection", "err", err)
			pc.sess.Close()
		}
		return nil, false
	}
	// The side connection the caller holds for this call, if any: the
	// body may follow on it, and a large answer goes back on it.
	if hdr.Side != 0 && pc.side != nil {
		r.side = pc.side.take(uint32(hdr.Side), lim.transferDeadline(time.Now(), 0))
	}
	if hdr.Side != 0 && r.side == nil && hdr.Stream {
		// The caller sends and reads this stream's frames on a side
		// connection the node does not have: served in-band, each side
		// would wait for the other. Reset, so that it fails at once.
		log.Debug("rpc: a message stream names a side connection the node cannot take", "side", hdr.Side)
		pc.fc.reset(st.StreamID())
		return nil, false
	}
	inBand := hdr.BodyLen
	if hdr.SideBody {
		inBand = 0
	}
	// The rest of the request must arrive at MinTransferRate or better.
	if rest := hdr.ArgLen + inBand; rest > int64(br.Buffered()) {
		st.SetReadDeadline(lim.transferDeadline(time.Now(), rest))
	}
	args, err := readArgs(br, hdr.ArgLen)
	if err != nil {
		pc.putSide(r.side, false)
		return nil, false
	}
	var (
		src     io.Reader = br
		bodyLen           = hdr.BodyLen
		rawLen            = hdr.RawLen
	)
	if hdr.SideBody {
		if r.side == nil {
			r.refused = Errorf(FailedPrecondition, "%s: the body is on side connection %d, which is not attached or is held by another call", hdr.Method, hdr.Side)
			bodyLen, rawLen = 0, 0
		} else {
			r.side.conn.SetReadDeadline(lim.transferDeadline(time.Now(), hdr.BodyLen))
			src = r.side
		}
	}
	// The body's tensors are allocated before its bytes arrive: take its
	// size from the peer's budget first, waiting for the peer's other
	// calls to give theirs back (until this call's deadline).
	var took int64
	if r.refused == nil && !over {
		took, r.refused = pc.bodies.takeBody(pc.ctx, hdr.Method, bodyLen, rawLen, hdr.TimeoutUS, lim.MaxBodyBytes)
	}
	r.in = &incoming{method: hdr.Method, args: args, body: newBodyReader(src, bodyLen, rawLen), res: s.resolverFor(pc.level),
		compress: pc.version >= 2 && !s.o.noLZ4 && !hdr.NoLZ4, bodies: pc.bodies, took: took, start: start, bodyIn: bodyLen}
	return r, true
}

// serveCall runs r's handler on this goroutine and answers it, then gives
// back what the call held (mappings, buffers, its body budget, the side
// connection). It reports whether st may serve another call: false when the
// stream is out of step, or the caller has left.
func (s *Server) serveCall(pc *peerConn, st *yamux.Stream, bw *bufio.Writer, r *request, over bool, log *slog.Logger) bool {
	in := r.in
	var run func(context.Context) (outgoing, error)
	err := r.refused
	if err == nil {
		run, err = s.decode(in, over)
	}
	if derr := in.body.drain(); derr != nil {
		in.release()
		pc.putSide(r.side, false)
		return false
	}
	if _, broken := errors.AsType[*streamError](err); broken {
		in.release()
		pc.putSide(r.side, false)
		return false
	}
	// The handler runs here, on the stream's goroutine. The caller cancels
	// by closing or resetting the stream, which the connection's reader
	// sees as the frame arrives (frameConn.watch), whatever is buffered;
	// the session's end ends pc.ctx.
	ctx, cancel := callContext(pc.ctx, r.hdr.TimeoutUS)
	st.SetReadDeadline(time.Time{})
	var left atomic.Bool
	id := st.StreamID()
	pc.fc.watch(id, func(uint16) {
		left.Store(true)
		cancel()
	})
	ok := s.respond(ctx, st, bw, in, run, err, r.side, log)
	pc.fc.unwatch(id)
	gone := left.Load() || pc.ctx.Err() != nil
	cancel()
	in.release()
	// The side connection goes back even if the caller has left: a caller
	// that closes its stream right after the answer (its pool is full)
	// leaves it in step; one that cancelled has closed it, which the next
	// use or attach sees.
	pc.putSide(r.side, ok)
	return ok && !gone
}

// putSide gives back the side connection a call held (nil: none); ok says
// whether it is still in step.
func (pc *peerConn) putSide(side *sideConn, ok bool) {
	if side != nil {
		pc.side.put(side, ok)
	}
}

// callContext returns the context of a call with the caller's remaining
// time (none when 0). A time past what a time.Duration holds (292 years) is
// that much: in Duration's nanoseconds it would wrap to a deadline already
// past.
func callContext(parent context.Context, timeoutUS int64) (context.Context, context.CancelFunc) {
	if timeoutUS > 0 {
		return context.WithTimeout(parent, time.Duration(min(timeoutUS, maxTimeoutUS))*time.Microsecond)
	}
	return context.WithCancel(parent)
}

// maxTimeoutUS is the largest timeout_us that a time.Duration holds.
const maxTimeoutUS = math.MaxInt64 / int64(time.Microsecond)

// smallResponse is the size under which a response is written without a
// deadline: it fits in the window every stream starts with (256 KiB).
const smallResponse = 128 << 10

// decode looks up the method and decodes the call; over means the peer has
// too many streams open and the call is refused.
func (s *Server) decode(in *incoming, over bool) (run func(context.Context) (outgoing, error), err error) {
	if over {
		return nil, Errorf(ResourceExhausted, "more than %d concurrent calls from this peer", s.o.limits.MaxStreamsPerPeer)
	}
	s.mu.RLock()
	h, stream := s.handlers[in.method], s.streams[in.method] != nil
	s.mu.RUnlock()
	if h == nil {
		if stream {
			return nil, Errorf(FailedPrecondition, "%q is a message stream, not a call", in.method)
		}
		return nil, Errorf(Unimplemented, "no method %q", in.method)
	}
	defer func() {
		// Decoding runs before any handler; a bug in it must cost one call,
		// not the node (handlers are guarded the same way).
		if p := recover(); p != nil {
			run, err = nil, Errorf(Internal, "%s: decoding the call panicked: %v", in.method, p)
			s.o.log.Error("rpc: decode panicked", "method", in.method, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	in.known = true
	return h(in)
}

// respond runs the call (unless decoding failed with derr) and writes the
// response. It reports whether the stream can carry another call.
func (s *Server) respond(ctx context.Context, st *yamux.Stream, bw *bufio.Writer, in *incoming, run func(context.Context) (outgoing, error), derr error, side *sideConn, log *slog.Logger) bool {
	var out outgoing
	err := derr
	if err == nil {
		out, err = run(ctx)
	}
	defer out.done(log, in.method) // after the body's write, or its end
	var hdr responseHeader
	var args []byte
	if err == nil {
		var bp *[]byte
		if bp, err = encodeArgs(out.resp); err != nil {
			err = Errorf(Internal, "%s: %v", in.method, err)
		} else {
			defer putArgs(bp) // written before respond returns
			args = *bp
		}
	}
	if err != nil {
		e := asError(err)
		if e.Code == Unknown || e.Code == Internal {
			log.Warn("rpc: call failed", "method", in.method, "err", err)
		}
		hdr = responseHeader{Code: uint8(e.Code), Message: truncate(e.Msg, maxMessage)}
		if validReason(e.Reason) {
			// A handler can build an *Error with any Reason; a malformed
			// one names nothing a caller registers, and is not sent.
			hdr.Reason = e.Reason
		}
		args, out.parts = nil, nil
	}
	body := sealBody(out.parts, in.compress)
	defer body.release()
	if err == nil {
		hdr = responseHeader{ArgLen: int64(len(args)), BodyLen: body.wireLen(), RawLen: body.rawLen()}
	}
	defer s.observe(in, Code(hdr.Code), hdr.BodyLen, false) // once the answer is written
	if side != nil {
		// The caller holds the side connection for this call: the whole
		// answer goes there, and it reads it from there.
		side.conn.SetWriteDeadline(s.o.limits.transferDeadline(time.Now(), hdr.ArgLen+hdr.BodyLen))
		if err := writeMessage(side.conn, &hdr, args, &body); err != nil {
			sideWriteFailed(log, side, in.method, err)
			return false
		}
		return true
	}
	if n := hdr.ArgLen + hdr.BodyLen; n > smallResponse {
		// A response larger than yamux's first window can block on a
		// caller that does not read it: bound the wait.
		st.SetWriteDeadline(s.o.limits.transferDeadline(time.Now(), n))
		defer st.SetWriteDeadline(time.Time{})
	}
	if err := writeFrame(bw, &hdr, args); err != nil {
		return false
	}
	if err := body.write(bw); err != nil {
		log.Warn("rpc: response body", "method", in.method, "err", err)
		return false
	}
	return bw.Flush() == nil
}

// maxMessage bounds an error message sent to a peer: messages can quote
// what the peer sent (a method name, a path), and a peer's client refuses
// response headers over its MaxHeaderBytes, dropping the connection.
const maxMessage = 4 << 10

// truncate shortens s to at most n bytes, cut at a rune boundary, marking
// the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "... (truncated)"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// sideWriteFailed logs a response that could not be written to its side
// connection: at Debug when nobody was reading it (the connection was
// killed, because its caller closed or reset it, it idled out or the
// server is closing, or the write found the peer gone), a caller's normal
// way to abandon a call; else at Warn.
func sideWriteFailed(log *slog.Logger, side *sideConn, method string, err error) {
	if side.dead.Load() || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		log.Debug("rpc: response not written: the caller left", "method", method, "err", err)
		return
	}
	log.Warn("rpc: response", "method", method, "err", err)
}
