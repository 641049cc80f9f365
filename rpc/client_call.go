package rpc

import (
	"bufio"
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A client's call path: the pool of idle streams on its connection
// (clientStream, clientConn.stream and put), Call, CallInto and Go, a
// call's round trip on a stream or on a side connection it holds
// (Client.sideCall), and the reading of the answer (readResponse; into.go
// reads CallInto's). The connection itself (Dial, the handshake, the yamux
// session) is in client.go.

type clientStream struct {
	st       *yamux.Stream
	br       *bufio.Reader
	bw       *bufio.Writer
	deadline time.Time // the stream's deadline as last set
	idle     time.Time // when it went back to the pool

}

// setDeadline sets the stream's deadline if it changed: yamux's deadlines
// allocate, and most calls reuse the zero one.
func (cs *clientStream) setDeadline(t time.Time) {
	if !t.Equal(cs.deadline) {
		cs.st.SetDeadline(t)
		cs.deadline = t
	}
}

// stream returns an idle stream the node still serves, or opens one.
func (cc *clientConn) stream() (*clientStream, error) {
	for {
		cc.mu.Lock()
		n := len(cc.idle)
		if n == 0 {
			cc.mu.Unlock()
			break
		}
		cs := cc.idle[n-1]
		cc.idle = cc.idle[:n-1]
		cc.mu.Unlock()
		if time.Since(cs.idle) < aliveCheckAfter || cs.alive() {
			return cs, nil
		}
		cs.st.Close()
	}
	st, err := cc.sess.OpenStream()
	if err != nil {
		return nil, err
	}
	return &clientStream{st: st, br: bufio.NewReaderSize(st, 32<<10), bw: bufio.NewWriterSize(frameWriter{st}, 32<<10)}, nil
}

// aliveCheckAfter is how long a stream may idle before it is checked with
// alive on reuse (the check costs a timer; nodes idle streams out after
// minutes, not seconds).
const aliveCheckAfter = time.Second

// alive reports whether an idle stream is still open at the node's end. The
// node closes streams that idle past its IdleTimeout; such a stream reads
// EOF at once, where a live one has nothing to read before the deadline.
func (cs *clientStream) alive() bool {
	if cs.br.Buffered() > 0 {
		return false // bytes nobody asked for: the stream is out of step
	}
	cs.st.SetReadDeadline(time.Unix(1, 0))
	_, err := cs.br.Peek(1)
	cs.st.SetReadDeadline(time.Time{})
	return errors.Is(err, yamux.ErrTimeout)
}

// maxIdleStreams bounds the pool of idle streams per connection.
const maxIdleStreams = 64

// put returns a stream that finished a call cleanly to the pool.
func (cc *clientConn) put(cs *clientStream) {
	cc.mu.Lock()
	if len(cc.idle) < maxIdleStreams && !cc.sess.IsClosed() {
		cc.idle = append(cc.idle, cs)
		cs = nil
	}
	cc.mu.Unlock()
	if cs != nil {
		cs.st.Close()
	}
}

// Call calls method on c's node with req and returns its response. Calls
// are safe from any number of goroutines; past Limits.MaxStreamsPerPeer in
// flight on c (the number a node serves of one peer at once, with the
// same default), a call waits for another to end. It
// blocks until the response arrives, ctx ends (the node's handler sees its
// context end too), or the connection fails. Errors are *Error values:
// the handler's; Unavailable when the node could not be reached, the
// connection broke, or the node fell silent (WithKeepAlive), also when
// that made ctx's deadline pass (errors.Is(err, context.DeadlineExceeded)
// holds then too); DeadlineExceeded or Canceled when ctx ended while the
// node was answering.
func Call[Resp, Req any](ctx context.Context, c *Client, method string, req Req) (Resp, error) {
	var resp Resp
	err := c.call(ctx, method, &req, &resp, nil)
	return resp, err
}

// CallInto is Call with the bytes of the response's TensorDicts read
// straight into TensorDicts the caller holds, as they arrive, instead of
// into new ones: a loop that receives a batch of the same shape on every
// call allocates nothing for it, and the bytes are copied once, from the
// connection into into.
//
// into[i] is for the i-th TD the response holds (in field order, depth
// first, as the package finds them; a nil into[i] takes none). It receives
// that TD's tensors when it fits: the same tensor keys, each with the same
// dtype and shape, the same batch size (of nested TensorDicts too), and no
// non-tensor data. The response's TD then holds into[i] itself (and the
// Rows the TD came with, as Call gives them). A TD that does not fit is
// made in Go memory as Call makes it, and into[i] is not written: compare
// the response's TensorDict with into[i] to tell. Tensors of into[i] may
// be in Go memory or mapped (written as WriteAt writes, without faults); a
// mapped one that cannot be written (its file truncated, its disk full)
// fails the call with Internal, its cause kept for errors.Is.
//
// into[i] must not be read or written by anything else during the call.
// When the call fails, the tensors of an into[i] that fitted may hold
// some of the response's bytes and some of what they held before.
func CallInto[Resp, Req any](ctx context.Context, c *Client, method string, req Req, into ...*tensordict.TensorDict) (Resp, error) {
	var resp Resp
	err := c.call(ctx, method, &req, &resp, into)
	return resp, err
}

// call runs one call; req and resp are pointers; into is CallInto's.
func (c *Client) call(ctx context.Context, method string, req, resp any, into []*tensordict.TensorDict) error {
	if err := ctx.Err(); err != nil {
		return transportError(ctx, method, err)
	}
	// A node serves MaxStreamsPerPeer calls of a peer at once and refuses
	// the rest: calls past that many wait here for their turn.
	select {
	case c.calls <- struct{}{}:
		defer func() { <-c.calls }()
	case <-ctx.Done():
		return transportError(ctx, method, ctx.Err())
	}
	cc, err := c.conn(ctx)
	if err != nil {
		return err
	}
	tds := findTDs(reflect.ValueOf(req).Elem(), nil)
	var parts []bodyPart
	for _, td := range tds {
		if parts, err = td.prepare(cc.link, parts); err != nil {
			return err
		}
	}
	argBuf, err := encodeArgs(req)
	if err != nil {
		return Errorf(InvalidArgument, "%s: %w", method, err)
	}
	defer putArgs(argBuf) // written (copied or sent) before the call returns
	args := *argBuf
	deadline, hasDeadline := ctx.Deadline()
	// seal builds the request's header and body for cc: compressed only
	// now, as a new connection may speak another version.
	var body outBody
	var hdr requestHeader
	seal := func() {
		body.release()
		compress := cc.version >= 2 && !c.o.noLZ4 && !isUncompressed(ctx)
		body = sealBody(parts, compress)
		hdr = requestHeader{Method: method, ArgLen: int64(len(args)), BodyLen: body.wireLen(), RawLen: body.rawLen(), NoLZ4: cc.version >= 2 && !compress}
		if hasDeadline {
			hdr.TimeoutUS = max(int64(time.Until(deadline)/time.Microsecond), 1)
		}
	}
	seal()
	defer func() { body.release() }()
	// A side connection for a large request body, or for a response that
	// may bring one: the whole call goes there.
	if side := cc.getSide(ctx, hdr.BodyLen >= sideMin || mayReturnBulk(tds, resp)); side != nil {
		return c.sideCall(ctx, cc, side, &hdr, args, &body, tds, resp, into)
	}
	cs, err := cc.stream()
	if err != nil {
		// The session died before anything was sent: safe to dial again once.
		if cc, err = c.conn(ctx); err == nil {
			seal()
			cs, err = cc.stream()
		}
		if err != nil {
			return transportError(ctx, method, err)
		}
	}
	cs.setDeadline(deadline)
	stop := context.AfterFunc(ctx, func() {
		// Unblock this call's reads and writes now; closing the stream
		// tells the node to cancel the handler.
		cs.st.SetDeadline(time.Unix(1, 0))
		cs.st.Close()
	})
	ok, err := cs.roundTrip(&hdr, args, &body, tds, resp, into, &c.o.limits, cc.version)
	if !stop() {
		ok = false // the stream was cut by the AfterFunc
	}
	if ok {
		cs.setDeadline(time.Time{})
		cs.idle = time.Now()
		cc.put(cs)
	} else {
		cs.st.Close()
	}
	return cc.callError(ctx, method, err)
}

// callError returns a call's error as its caller sees it: the node's, or
// the transport's (Unavailable when the watchdog gave up on the session).
func (cc *clientConn) callError(ctx context.Context, method string, err error) error {
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return err
		}
		if werr := cc.dog.err(ctx, method, err); werr != nil {
			return werr
		}
		return transportError(ctx, method, err)
	}
	return nil
}

// sideCall runs a call on the side connection it holds: the whole request
// (header, argument, body) in one writev, the whole answer read back, and
// nothing in the session. Closing the side connection (ctx's end) cancels
// the node's handler; a side connection not in step afterwards is closed.
func (c *Client) sideCall(ctx context.Context, cc *clientConn, side *sideConn, hdr *requestHeader, args []byte, body *outBody, tds []*TD, resp any, into []*tensordict.TensorDict) error {
	deadline, _ := ctx.Deadline()
	side.conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() {
		side.conn.SetDeadline(time.Unix(1, 0))
	})
	var ok bool
	err := writeTagged(side.conn, true, hdr, args, body)
	if err == nil {
		ok, err = readResponse(side.br, hdr.Method, tds, resp, into, &c.o.limits, cc.version)
		ok = ok && side.br.Buffered() == 0
	}
	if !stop() {
		ok = false // cut by the AfterFunc: the node may be mid-answer
	}
	cc.side.put(side, ok)
	return cc.callError(ctx, hdr.Method, err)
}

// mayReturnBulk reports whether a call's response may bring a large body:
// its type can hold TDs, or a request TD comes back.
func mayReturnBulk(tds []*TD, resp any) bool {
	if holdsTD(reflect.TypeOf(resp).Elem()) {
		return true
	}
	for _, td := range tds {
		if td.wire.comesBack() {
			return true
		}
	}
	return false
}

// roundTrip writes the request and reads the response. ok reports whether
// the stream is still in step (it may carry another call). version is the
// connection's protocol version.
func (cs *clientStream) roundTrip(hdr *requestHeader, args []byte, body *outBody, tds []*TD, resp any, into []*tensordict.TensorDict, lim *Limits, version uint8) (ok bool, err error) {
	if err := writeFrame(cs.bw, hdr, args); err != nil {
		return false, err
	}
	if err := body.write(cs.bw); err != nil {
		return false, err
	}
	if err := cs.bw.Flush(); err != nil {
		return false, err
	}
	return readResponse(cs.br, hdr.Method, tds, resp, into, lim, version)
}

// readResponse reads a call's response from br, its TDs into into where
// they fit (CallInto). ok reports whether br is still in step (it may
// carry another response).
func readResponse(br *bufio.Reader, method string, tds []*TD, resp any, into []*tensordict.TensorDict, lim *Limits, version uint8) (ok bool, err error) {
	var rh responseHeader
	if err := readHeader(br, lim.MaxHeaderBytes, &rh); err != nil {
		return false, unexpected(err)
	}
	if rh.Code != uint8(OK) {
		if rh.ArgLen != 0 || rh.BodyLen != 0 {
			return false, Errorf(Internal, "%s: error response with a payload", method)
		}
		// The node closes a stream it refused for being over its limit.
		return Code(rh.Code) != ResourceExhausted, &Error{Code: Code(rh.Code), Reason: rh.Reason, Msg: rh.Message}
	}
	if err := checkLens(rh.ArgLen, rh.BodyLen, lim); err != nil {
		return false, err
	}
	if err := checkRaw(rh.BodyLen, rh.RawLen, lim, version >= 2); err != nil {
		return false, err
	}
	rargs, err := readArgs(br, rh.ArgLen)
	if err != nil {
		return false, err
	}
	rbody := newBodyReader(br, rh.BodyLen, rh.RawLen).corruptCode(Internal)
	if err := decodeMsgpack(rargs, resp); err != nil {
		return rbody.drain() == nil, Errorf(Internal, "%s: response: %v", method, err)
	}
	err = readResultTDs(rbody, tds, findTDs(reflect.ValueOf(resp).Elem(), nil), into)
	if derr := rbody.drain(); derr != nil {
		return false, derr
	}
	if _, broken := errors.AsType[*streamError](err); broken {
		return false, err
	}
	return true, err
}

// readResultTDs reads the response body: the contents of request TDs sent
// as bytes with Out set, then the response's own TDs (respTDs[i] into
// into[i] where it fits). The Out contents are read into TensorDicts of
// their own and written back into the caller's only once the whole body is
// in and checked (a compressed one's frame ended where it should): a call
// that fails midway (a connection that breaks, a corrupt body) leaves the
// caller's TensorDicts as they were.
func readResultTDs(body *bodyReader, reqTDs, respTDs []*TD, into []*tensordict.TensorDict) error {
	var wires []*wireTD
	for _, td := range reqTDs {
		if td.wire.comesBack() {
			wires = append(wires, td.wire)
		}
	}
	for _, td := range respTDs {
		wires = append(wires, td.wire)
	}
	if err := checkBody(wires, body.n); err != nil {
		return Errorf(Internal, "response: %s", asError(err).Msg)
	}
	var staged [1]*tensordict.TensorDict // most calls have one Out TD at most
	backs := staged[:0]
	for _, td := range reqTDs {
		if !td.wire.comesBack() {
			continue
		}
		back := &TD{wire: td.wire}
		if err := back.build(nil, body.fill, nil); err != nil {
			return err
		}
		backs = append(backs, back.TensorDict)
	}
	var buf *[]byte // fillInto's, for mapped tensors
	defer func() {
		if buf != nil {
			putBuf(buf)
		}
	}()
	for i, td := range respTDs {
		if i < len(into) && into[i] != nil && td.wire.fits(into[i]) {
			if err := td.fillInto(into[i], body, &buf); err != nil {
				return err
			}
			continue
		}
		if err := td.build(nil, body.fill, nil); err != nil {
			return err
		}
	}
	// Every byte is in and checked (the last read ended a compressed
	// body's frame): the Out contents go back now.
	for _, td := range reqTDs {
		if !td.wire.comesBack() {
			continue
		}
		if err := td.applyWriteback(backs[0]); err != nil {
			return Errorf(Internal, "writing the node's results back: %w", err)
		}
		backs = backs[1:]
	}
	return nil
}

// Future is a call in progress, started by Go.
type Future[Resp any] struct {
	done chan struct{}
	resp Resp
	err  error
}

// Go starts a call like Call and returns at once; the Future delivers the
// result. ctx governs the call as it does for Call.
func Go[Resp, Req any](ctx context.Context, c *Client, method string, req Req) *Future[Resp] {
	f := &Future[Resp]{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.err = c.call(ctx, method, &req, &f.resp, nil)
	}()
	return f
}

// Done is closed when the call has finished.
func (f *Future[Resp]) Done() <-chan struct{} { return f.done }

// Wait blocks until the call has finished and returns its result.
func (f *Future[Resp]) Wait() (Resp, error) {
	<-f.done
	return f.resp, f.err
}
