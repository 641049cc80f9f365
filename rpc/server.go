package rpc

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/yamux"
)

// Server serves registered handlers to the peers that connect to it. Build
// one with NewServer, register handlers with Register, then call Serve with
// one or more listeners. Every Server also serves the built-in TensorDict
// services (fill, read, describe; see services.go).
//
// A Server is safe for concurrent use. Register handlers before Serve: a
// method registered later is served from then on.
type Server struct {
	o    options
	fsid FSID
	host hostID    // this node's kernel and root mount
	root string    // absolute, symlinks resolved; "" without a root
	res  *resolver // nil without a root

	mu        sync.RWMutex
	handlers  map[string]handler
	streams   map[string]streamHandler // message streams (stream.go)
	listeners map[net.Listener]struct{}
	conns     map[*peerConn]struct{}
	sides     map[[32]byte]*sideSet // version 3 sessions' side connections, by their secret
	closed    bool

	handshakes atomic.Int32 // connections in serveConn before their session starts
	refusals   refusalLog   // rate-limits the log lines of refused handshakes

	ctx    context.Context // ends at Close; parent of every call's context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

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
	resp  any
	parts []bodyPart
}

// NewServer returns a Server configured by opts (WithRoot, WithToken,
// WithTLS, WithLogger, WithLimits, WithWindow, WithKeepAlive,
// WithCompression, WithSideConnections, WithCoherentStorage). With a root,
// the server reads or creates the root's FSID and resolves references
// under it. Limits with a negative field are refused (ErrInvalidArgument).
func NewServer(opts ...Option) (*Server, error) {
	s := &Server{
		o:         newOptions(opts),
		handlers:  map[string]handler{},
		streams:   map[string]streamHandler{},
		listeners: map[net.Listener]struct{}{},
		conns:     map[*peerConn]struct{}{},
		sides:     map[[32]byte]*sideSet{},
	}
	var err error
	if s.o.limits, err = s.o.limits.validate(); err != nil {
		return nil, err
	}
	if s.o.root != "" {
		dir, fsid, err := openRoot(s.o.root)
		if err != nil {
			return nil, err
		}
		s.fsid, s.root = fsid, dir
		sweepProbes(dir)
		if s.res, err = newResolver(dir, 1024); err != nil {
			return nil, err
		}
	}
	s.host = localHostID(s.root)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.res != nil {
		s.wg.Add(1)
		go s.sweep()
	}
	registerServices(s)
	return s, nil
}

// sweep has the resolver drop mappings of deleted files and long-unused
// ones until the server closes.
func (s *Server) sweep() {
	defer s.wg.Done()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.res.sweep(mappingIdle)
		case <-s.ctx.Done():
			return
		}
	}
}

// How often cached mappings are checked, and how long an unused one stays.
const (
	sweepEvery  = 10 * time.Second
	mappingIdle = 5 * time.Minute
)

// peekRoot is openRoot for a client: a root without FSIDFile has the zero
// FSID (no node has made it a root) and is left as it is, since a client
// given any folder must not write into it.
func peekRoot(dir string) (string, FSID, error) {
	abs, _, err := absRoot(dir)
	if err != nil {
		return "", FSID{}, err
	}
	id, err := readFSIDFile(filepath.Join(abs, FSIDFile))
	if errors.Is(err, os.ErrNotExist) {
		return abs, FSID{}, nil
	}
	return abs, id, err
}

// openRoot returns the shared root dir as an absolute path with symlinks
// resolved, and its filesystem identity (created if it has none).
func openRoot(dir string) (string, FSID, error) {
	abs, _, err := absRoot(dir)
	if err != nil {
		return "", FSID{}, err
	}
	id, err := ReadFSID(abs)
	return abs, id, err
}

// absRoot checks that dir is a directory and returns it absolute, its
// symlinks resolved.
func absRoot(dir string) (string, os.FileInfo, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return "", nil, fmt.Errorf("rpc: root: %w", err) // names the whole path
	} else if !fi.IsDir() {
		return "", nil, fmt.Errorf("rpc: root %s is not a directory", dir)
	}
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", nil, fmt.Errorf("rpc: root %q: %w", dir, err)
	}
	return abs, fi, nil
}

// FSID returns the identity of the server's root, or the zero FSID.
func (s *Server) FSID() FSID { return s.fsid }

// Root returns the server's shared root as an absolute path with symlinks
// resolved, or "" without one.
func (s *Server) Root() string { return s.root }

// Rel returns path relative to the server's root, slash-separated, as a
// service names a file to its callers (they join it to their own view of
// the root); false without a root, or if path, its symlinks resolved, does
// not lie inside the root. A path inside the root through a symlink that
// leads out is not inside: a peer sharing the root may not share where the
// symlink leads. The root itself is ".".
func (s *Server) Rel(path string) (string, bool) { return relPath(s.root, path, true) }

// Register makes fn callable as method on s. Req and Resp are encoded with
// msgpack (exported fields; `codec:"name"` tags rename them); TD fields in
// them carry TensorDicts (see TD). The error fn returns reaches the caller
// with the code CodeOf gives it, and with its reason when it matches a
// sentinel registered with RegisterReason; return an *Error (Errorf) to
// choose the code. A panic in fn is recovered and reported as Internal.
//
// fn's context carries the caller's deadline and ends when the caller
// cancels, goes away, or the server is closed. Registering a method twice
// is an error.
func Register[Req, Resp any](s *Server, method string, fn func(ctx context.Context, req Req) (Resp, error)) error {
	h := func(in *incoming) (func(context.Context) (outgoing, error), error) {
		req := new(Req)
		if err := decodeMsgpack(in.args, req); err != nil {
			return nil, Errorf(InvalidArgument, "%s: %v", method, err)
		}
		in.req = req
		tds := findTDs(reflect.ValueOf(req).Elem(), nil)
		if err := in.buildTDs(tds); err != nil {
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
			if err != nil {
				return out, err
			}
			for _, td := range tds {
				out.parts = append(out.parts, td.writeback()...)
			}
			for _, td := range findTDs(reflect.ValueOf(&resp).Elem(), nil) {
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
// holds exactly the bytes they need.
func (in *incoming) buildTDs(tds []*TD) error {
	wires := make([]*wireTD, len(tds))
	for i, td := range tds {
		wires[i] = td.wire
	}
	if err := checkBody(wires, in.body.n); err != nil {
		return err
	}
	d := &decoded{pooled: true}
	defer func() { in.held, in.bufs = d.held, d.bufs }()
	for _, td := range tds {
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
	if in.bodies != nil {
		in.bodies.give(in.took)
		in.bodies, in.took = nil, 0
	}
}

// Serve accepts connections on l and serves them until l fails or the
// server is closed; it then returns the listener's error (nil after Close).
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var delay time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// EMFILE and the like: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.o.log.Warn("rpc: accept", "err", err, "retry_in", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(conn)
		}()
	}
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("rpc: server closed")

func (s *Server) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// Close stops the listeners, closes every connection (calls in flight see
// their context end, callers see Unavailable), waits for the handlers to
// return, and unmaps the cached files.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for pc := range s.conns {
		pc.sess.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.refusals.flush(s.o.log)
	if s.res != nil {
		return s.res.close()
	}
	return nil
}

// peerConn is one connected peer.
type peerConn struct {
	sess    *yamux.Session
	fc      *frameConn
	version uint8 // the protocol version the connection speaks
	remote  string
	sharing Sharing         // what the handshake decided
	level   *peerLevel      // the same, as its calls' contexts carry it
	side    *sideSet        // version 3: the session's side connections; nil: none
	ctx     context.Context // ends with the session (or the server)
	active  atomic.Int32    // streams being served
	msgs    atomic.Int32    // message streams among them
	room    chan struct{}   // a stream ended: the accept loop may take another
	bodies  *budget         // bytes of bodies allocated before they arrive (budget.go)
}

// serveConn runs the handshake on conn and then serves its streams.
func (s *Server) serveConn(conn net.Conn) {
	remote := conn.RemoteAddr().String()
	log := s.o.log.With("peer", remote)
	s.handshakes.Add(1)
	handshaking := true
	defer func() {
		if handshaking {
			s.handshakes.Add(-1)
		}
	}()
	conn.SetDeadline(time.Now().Add(s.o.limits.HandshakeTimeout))
	// Close must not wait for a peer that stalls in the handshake.
	stop := context.AfterFunc(s.ctx, func() { conn.Close() })
	defer stop()
	var rw net.Conn = conn
	if s.o.tls != nil {
		tc := tls.Server(conn, s.o.tls)
		if err := tc.HandshakeContext(s.ctx); err != nil {
			s.refusals.refused(s.o.log, remote, "rpc: TLS handshake failed", "err", err)
			conn.Close()
			return
		}
		rw = tc
	}
	var (
		attaching bool // the peer authenticated and asked to attach a side connection
		secret    [32]byte
		set       *sideSet  // this session's, once its secret is given
		attached  *sideConn // this connection, attached to another session
		attachTo  *sideSet  // that session's set
	)
	level := &peerLevel{log: log}
	// At the session's end: a coherence probe's step 1 still running then
	// drops its mapping itself (peerLevel.setProbe).
	defer level.dropProbe()
	offer := &sideOffer{}
	if !s.o.noSide {
		offer.session = func() (sessionMsg, error) {
			var err error
			if secret, err = newSecret(); err != nil {
				return sessionMsg{}, err
			}
			set = newSideSet(s, log, s.o.limits.MaxSideConns)
			// Calls on the session's side connections see its level, known
			// only after the where messages: None until then.
			set.ctx = context.WithValue(set.ctx, peerSharingKey{}, level)
			s.mu.Lock()
			s.sides[secret] = set
			s.mu.Unlock()
			return sessionMsg{secret: secret, max: uint16(min(s.o.limits.MaxSideConns, math.MaxUint16))}, nil
		}
		offer.attach = func(a attachMsg) error {
			attaching = true
			s.mu.RLock()
			target := s.sides[a.secret]
			s.mu.RUnlock()
			if target == nil {
				return Errorf(Unauthenticated, "no session has this secret")
			}
			var err error
			attached, err = target.add(a.id, rw)
			attachTo = target
			return err
		}
	}
	dropSet := func() {
		if set != nil {
			s.mu.Lock()
			delete(s.sides, secret)
			s.mu.Unlock()
			set.close()
		}
	}
	peer, err := serverHandshakeSide(rw, cmp.Or(s.o.version, ProtocolVersion), rootSide{fsid: s.fsid, root: s.root, host: s.host}, s.o.token, offer)
	if err != nil {
		s.refusals.refused(s.o.log, remote, "rpc: handshake refused", "err", err)
		if e, ok := err.(*Error); ok && e.Code == Unauthenticated && !attaching && s.o.onAuthFailure != nil {
			s.o.onAuthFailure(remote, err)
		}
		if attached != nil {
			attached.kill()
		}
		dropSet()
		rw.Close()
		return
	}
	if peer.attach {
		rw.SetDeadline(time.Time{})
		// A side connection: it lives in its session's set from now on,
		// and closes with the session.
		log.Debug("rpc: side connection attached", "id", attached.id)
		attachTo.start(attached)
		return
	}
	sharing, why := peer.sharing, peer.why
	rw.SetDeadline(time.Time{})
	fc := newFrameConn(rw)
	sess, err := yamux.Server(fc, s.o.yamuxConfig(false))
	if err != nil {
		dropSet()
		rw.Close()
		return
	}
	pc := &peerConn{sess: sess, fc: fc, version: peer.version, remote: remote, sharing: sharing, level: level, side: set, room: make(chan struct{}, 1)}
	if pc.bodies = newBudget(s.o.limits.MaxBodyBytes); set != nil {
		pc.bodies = set.bodies // one budget for the session, whichever connection a body comes on
	}
	defer dropSet()
	var cancelPC context.CancelFunc
	level.set(sharing)
	pc.ctx, cancelPC = context.WithCancel(context.WithValue(s.ctx, peerSharingKey{}, level))
	defer cancelPC()
	go func() {
		select {
		case <-sess.CloseChan():
			cancelPC()
		case <-pc.ctx.Done():
		}
	}()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sess.Close()
		return
	}
	s.conns[pc] = struct{}{}
	s.mu.Unlock()
	s.handshakes.Add(-1)
	handshaking = false
	if sharing < Coherent && !peer.fsid.IsZero() && peer.fsid == s.fsid {
		// A client that names this root but does not share its page cache:
		// say once why its references are off.
		log.Info("rpc: peer connected; it does not share this node's page cache, so what changes in place travels as bytes", "sharing", sharing, "why", why)
	} else {
		log.Debug("rpc: peer connected", "sharing", sharing, "why", why)
	}
	defer func() {
		s.mu.Lock()
		delete(s.conns, pc)
		s.mu.Unlock()
		sess.Close()
		log.Debug("rpc: peer gone")
	}()
	limit := int32(s.o.limits.MaxStreamsPerPeer)
	for {
		// Past twice the limit (the limit's streams and as many refusals)
		// take no more: yamux's accept backlog holds the next ones and
		// resets the rest at once, before they cost a goroutine and buffers.
		for pc.active.Load() >= 2*limit {
			select {
			case <-pc.room:
			case <-sess.CloseChan():
				return
			}
		}
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		over := pc.active.Add(1) > limit
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveStream(pc, st, over, log)
		}()
	}
}

// serveStream serves the calls that arrive on st, one after another, until
// the peer closes it, it idles out, or the peer breaks the protocol (then
// the whole connection is closed); over: the peer has more than
// MaxStreamsPerPeer streams open, and st serves one refusal.
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
	id := st.StreamID()
	if over {
		// A stream over the limit serves one refusal: it may not wait long
		// for it, or a peer could hold any number of them open.
		st.SetReadDeadline(lim.transferDeadline(time.Now(), 0))
	} else {
		st.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
	}
	for {
		var hdr requestHeader
		err := readHeader(br, lim.MaxHeaderBytes, &hdr)
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
			return
		}
		// The side connection the caller holds for this call, if any: the
		// body may follow on it, and a large answer goes back on it.
		var side *sideConn
		if hdr.Side != 0 && pc.side != nil {
			side = pc.side.take(uint32(hdr.Side), lim.transferDeadline(time.Now(), 0))
		}
		if hdr.Side != 0 && side == nil && hdr.Stream {
			// The caller sends and reads this stream's frames on a side
			// connection the node does not have: served in-band, each side
			// would wait for the other. Reset, so that it fails at once.
			log.Debug("rpc: a message stream names a side connection the node cannot take", "side", hdr.Side)
			pc.fc.reset(id)
			return
		}
		putSide := func(ok bool) {
			if side != nil {
				pc.side.put(side, ok)
			}
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
			putSide(false)
			return
		}
		var (
			src     io.Reader = br
			bodyLen           = hdr.BodyLen
			rawLen            = hdr.RawLen
			refused error     // of a body on a side connection this call cannot read
		)
		if hdr.SideBody {
			if side == nil {
				refused = Errorf(FailedPrecondition, "%s: the body is on side connection %d, which is not attached or is held by another call", hdr.Method, hdr.Side)
				bodyLen, rawLen = 0, 0
			} else {
				side.conn.SetReadDeadline(lim.transferDeadline(time.Now(), hdr.BodyLen))
				src = side
			}
		}
		// The body's tensors are allocated before its bytes arrive: take
		// its size from the peer's budget first, waiting for the peer's
		// other calls to give theirs back (until this call's deadline).
		var took int64
		if refused == nil && !over {
			took, refused = pc.bodies.takeBody(pc.ctx, hdr.Method, bodyLen, rawLen, hdr.TimeoutUS, lim.MaxBodyBytes)
		}
		in := &incoming{method: hdr.Method, args: args, body: newBodyReader(src, bodyLen, rawLen), res: s.res,
			compress: pc.version >= 2 && !s.o.noLZ4 && !hdr.NoLZ4, bodies: pc.bodies, took: took, start: start, bodyIn: bodyLen}
		if hdr.Stream {
			// The stream carries this message stream and nothing after it.
			s.serveMessageStream(pc, st, br, bw, &hdr, in, over, refused, side, log)
			return
		}
		var run func(context.Context) (outgoing, error)
		if err = refused; err == nil {
			run, err = s.decode(in, over)
		}
		if derr := in.body.drain(); derr != nil {
			in.release()
			putSide(false)
			return
		}
		if _, broken := errors.AsType[*streamError](err); broken {
			in.release()
			putSide(false)
			return
		}
		// The handler runs here, on the stream's goroutine. The caller
		// cancels by closing or resetting the stream, which the
		// connection's reader sees as the frame arrives (frameConn.watch),
		// whatever is buffered; the session's end ends pc.ctx.
		ctx, cancel := callContext(pc.ctx, hdr.TimeoutUS)
		st.SetReadDeadline(time.Time{})
		var left atomic.Bool
		pc.fc.watch(id, func(uint16) {
			left.Store(true)
			cancel()
		})
		ok := s.respond(ctx, st, bw, in, run, err, side, log)
		pc.fc.unwatch(id)
		gone := left.Load() || pc.ctx.Err() != nil
		cancel()
		in.release()
		// The side connection goes back even if the caller has left: a caller
		// that closes its stream right after the answer (its pool is full)
		// leaves it in step; one that cancelled has closed it, which the
		// next use or attach sees.
		putSide(ok)
		if !ok || over || gone {
			return // out of step, refused, or the caller has left
		}
		st.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
	}
}

// serveSide reads the requests that come on side connection sc, one after
// another, and starts each call (sideCall); done is closed when it returns.
// It reads the next request while a call runs, so it sees the caller close
// the connection at once (which cancels the call: sc.ctx); a request that
// comes before the call before is done waits for it. It returns when the
// connection ends, breaks the protocol, idles out (Limits.IdleTimeout), or
// is taken by a message stream (sideConn.unwatch), with the byte it read
// then left pending for the stream.
func (s *Server) serveSide(set *sideSet, sc *sideConn, done chan struct{}) {
	defer s.wg.Done()
	defer close(done)
	var prev chan struct{} // the call in progress
	for {
		if !sc.pending {
			var b [1]byte
			n, err := sc.conn.Read(b[:])
			if n == 0 {
				if errors.Is(err, os.ErrDeadlineExceeded) && sc.stopping.Load() {
					return // taken by a message stream
				}
				sc.kill() // closed, reset or idle: ends the call in progress
				return
			}
			sc.pend, sc.pending = b[0], true
		}
		if prev != nil {
			<-prev
			prev = nil
		}
		if sc.pend != sideCallTag {
			// A message stream's frame, whose opening request, in the
			// session, the node may not have read yet: the byte is the
			// stream's once it takes the connection.
			s.awaitTake(set, sc)
			return
		}
		set.mu.Lock()
		if set.busy[sc.id] || sc.dead.Load() || set.closed {
			set.mu.Unlock()
			return // taken by a message stream: the byte is its
		}
		set.busy[sc.id] = true
		sc.pending = false // the tag
		set.mu.Unlock()
		if prev = s.sideCall(set, sc); prev == nil {
			return
		}
	}
}

// awaitTake waits for a message stream to take side connection sc, whose
// next byte is not a call's: for at most TransferGrace, then sc is closed.
func (s *Server) awaitTake(set *sideSet, sc *sideConn) {
	timer := time.NewTimer(s.o.limits.TransferGrace)
	defer timer.Stop()
	for {
		set.mu.Lock()
		if set.busy[sc.id] || sc.dead.Load() || set.closed {
			set.mu.Unlock()
			return
		}
		ch := set.changed
		set.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			set.log.Warn("rpc: closing side connection", "id", sc.id, "err", fmt.Errorf("%w: bytes on an idle side connection that no message stream took", errProtocol))
			sc.kill()
			return
		}
	}
}

// sideCall reads a call's request from side connection sc, held for it,
// and starts its handler, which answers on sc and then gives it back. It
// returns a channel closed when the call is done, or nil when sc was closed
// (a request that breaks the protocol, a short read, the session's end).
func (s *Server) sideCall(set *sideSet, sc *sideConn) chan struct{} {
	lim := &s.o.limits
	log := set.log
	fail := func(err error) chan struct{} {
		if errors.Is(err, errProtocol) {
			log.Warn("rpc: closing side connection", "id", sc.id, "err", err)
		}
		sc.kill()
		return nil
	}
	sc.conn.SetReadDeadline(lim.transferDeadline(time.Now(), 0))
	var hdr requestHeader
	err := readHeader(sc.br, lim.MaxHeaderBytes, &hdr)
	start := time.Now()
	if err == nil {
		err = checkLens(hdr.ArgLen, hdr.BodyLen, lim)
	}
	if err == nil {
		err = checkRaw(hdr.BodyLen, hdr.RawLen, lim, true)
	}
	if err == nil && (hdr.Stream || hdr.Side != 0 || hdr.SideBody) {
		err = fmt.Errorf("%w: a request on a side connection with stream, side or side_body", errProtocol)
	}
	if err != nil {
		return fail(err)
	}
	if rest := hdr.ArgLen + hdr.BodyLen; rest > int64(sc.br.Buffered()) {
		sc.conn.SetReadDeadline(lim.transferDeadline(time.Now(), rest))
	}
	args, err := readArgs(sc.br, hdr.ArgLen)
	if err != nil {
		return fail(err)
	}
	// The body's share of the session's budget, as for a call on yamux.
	took, refused := set.bodies.takeBody(sc.ctx, hdr.Method, hdr.BodyLen, hdr.RawLen, hdr.TimeoutUS, lim.MaxBodyBytes)
	in := &incoming{method: hdr.Method, args: args, body: newBodyReader(sc.br, hdr.BodyLen, hdr.RawLen), res: s.res,
		compress: !s.o.noLZ4 && !hdr.NoLZ4, bodies: set.bodies, took: took, start: start, bodyIn: hdr.BodyLen}
	var run func(context.Context) (outgoing, error)
	if err = refused; err == nil {
		run, err = s.decode(in, false)
	}
	if derr := in.body.drain(); derr != nil {
		in.release()
		return fail(derr)
	}
	if _, broken := errors.AsType[*streamError](err); broken {
		in.release()
		return fail(err)
	}
	if sc.br.Buffered() != 0 {
		in.release()
		return fail(fmt.Errorf("%w: bytes after a request on a side connection", errProtocol))
	}
	// The next read (serveSide's) waits for the caller's next request, or
	// its close, for as long as the call runs.
	sc.conn.SetReadDeadline(time.Time{})
	set.mu.Lock()
	if set.closed {
		set.mu.Unlock()
		in.release()
		sc.kill()
		return nil
	}
	s.wg.Add(1)
	set.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer s.wg.Done()
		defer close(done)
		ctx, cancel := callContext(sc.ctx, hdr.TimeoutUS)
		ok := s.respond(ctx, nil, nil, in, run, err, sc, log)
		cancel()
		in.release()
		if !ok || sc.dead.Load() {
			sc.kill()
			return
		}
		sc.conn.SetWriteDeadline(time.Time{})
		set.mu.Lock()
		delete(set.busy, sc.id)
		set.signal()
		sc.conn.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
		set.mu.Unlock()
	}()
	return done
}

// callContext returns the context of a call with the caller's remaining
// time (none when 0).
func callContext(parent context.Context, timeoutUS int64) (context.Context, context.CancelFunc) {
	if timeoutUS > 0 {
		return context.WithTimeout(parent, time.Duration(timeoutUS)*time.Microsecond)
	}
	return context.WithCancel(parent)
}

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
			log.Warn("rpc: response", "method", in.method, "err", err)
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
