package rpc

import (
	"cmp"
	"context"
	"crypto/tls"
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// A connection the server accepted, from its first byte to its session's
// end: TLS, the handshake with its side-connection offer, then either a
// side connection attached to another session (server_side.go) or a yamux
// session of this peer's, whose streams it accepts and hands to
// serveStream (server_call.go).

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

// serveConn runs the handshake on conn and then serves its streams. Its
// steps: TLS (startTLS); the handshake, with its offer of side connections
// (handshake); then, for a side connection, handing it to the session it
// attached to (startAttached), else the connection's own yamux session
// (serveSession), served until it ends. conn counts among the handshakes
// in progress (Stats.Handshakes) until its session starts or it is done,
// and Close closes it at any step.
func (s *Server) serveConn(conn net.Conn) {
	remote := conn.RemoteAddr().String()
	c := &serverConn{s: s, conn: conn, rw: conn, remote: remote, log: s.o.log.With("peer", remote)}
	s.handshakes.Add(1)
	c.handshaking = true
	defer c.handshakeDone()
	conn.SetDeadline(time.Now().Add(s.o.limits.HandshakeTimeout))
	// Close must not wait for a peer that stalls in the handshake.
	stop := context.AfterFunc(s.ctx, func() { conn.Close() })
	defer stop()
	if !c.startTLS() {
		return
	}
	c.level = newPeerLevel(c.log)
	// At the session's end: a coherence probe's step 1 still running then
	// drops its mapping itself (peerLevel.setProbe).
	defer c.level.dropProbe()
	peer, ok := c.handshake()
	if !ok {
		return
	}
	if peer.attach {
		c.startAttached()
		return
	}
	c.serveSession(peer)
}

// serverConn is what the steps of serveConn share about one accepted
// connection; it lives until serveConn returns, on its goroutine only.
type serverConn struct {
	s           *Server
	conn        net.Conn     // as accepted
	rw          net.Conn     // conn, or TLS over it once startTLS has run
	remote      string       // the peer's address
	log         *slog.Logger // the server's, with the peer's address
	level       *peerLevel   // the sharing level the peer's calls see (its contexts carry it)
	handshaking bool         // counted in s.handshakes (handshakeDone)

	// What the side-connection offer did (openSideSession, attach).
	attaching bool      // the peer authenticated and asked to attach a side connection
	secret    [32]byte  // this session's, once openSideSession has made it
	set       *sideSet  // this session's side connections, once its secret is given; nil: none
	attached  *sideConn // this connection, attached to another session
	target    *sideSet  // that session's set
}

// handshakeDone stops counting the connection among the server's
// handshakes in progress, once.
func (c *serverConn) handshakeDone() {
	if c.handshaking {
		c.s.handshakes.Add(-1)
		c.handshaking = false
	}
}

// startTLS runs the TLS handshake on the accepted connection when the
// server has WithTLS, and makes c.rw the TLS connection. A failed TLS
// handshake is logged (rate-limited, as refusals are) and closes the
// connection: false.
func (c *serverConn) startTLS() bool {
	s := c.s
	if s.o.tls == nil {
		return true
	}
	tc := tls.Server(c.conn, s.o.tls)
	if err := tc.HandshakeContext(s.ctx); err != nil {
		s.refusals.refused(s.o.log, c.remote, "rpc: TLS handshake failed", "err", err)
		c.conn.Close()
		return false
	}
	c.rw = tc
	return true
}

// handshake runs the server's side of the handshake on c.rw, with the
// side-connection offer of sideOffer, and returns what it learnt of the
// peer. On a refusal it logs it (rate-limited), tells WithAuthFailure's
// hook of a main connection that failed to authenticate, undoes what the
// offer did (the side connection attached, the session's set) and closes
// the connection: false.
func (c *serverConn) handshake() (peerInfo, bool) {
	s := c.s
	peer, err := serverHandshakeSide(c.rw, cmp.Or(s.o.version, ProtocolVersion), rootSide{fsid: s.fsid, root: s.root, host: s.host}, s.o.token, c.sideOffer())
	if err != nil {
		s.refusals.refused(s.o.log, c.remote, "rpc: handshake refused", "err", err)
		if e, ok := err.(*Error); ok && e.Code == Unauthenticated && !c.attaching && s.o.onAuthFailure != nil {
			s.o.onAuthFailure(c.remote, err)
		}
		if c.attached != nil {
			c.attached.kill()
		}
		c.dropSideSet()
		c.rw.Close()
		return peerInfo{}, false
	}
	return peer, true
}

// sideOffer returns what the handshake offers of side connections: nothing
// without them (WithSideConnections); else a session of their own to main
// connections (openSideSession) and attaching to a session to side
// connections (attach).
func (c *serverConn) sideOffer() *sideOffer {
	offer := &sideOffer{}
	if !c.s.o.noSide {
		offer.session, offer.attach = c.openSideSession, c.attach
	}
	return offer
}

// openSideSession is the offer's step for a version 3 main connection: it
// makes the session's secret and its set of side connections, registers
// the set under the secret for side connections to attach to, and returns
// the session message that tells the client both.
func (c *serverConn) openSideSession() (sessionMsg, error) {
	s := c.s
	var err error
	if c.secret, err = newSecret(); err != nil {
		return sessionMsg{}, err
	}
	c.set = newSideSet(s, c.log, s.o.limits.MaxSideConns)
	// Calls on the session's side connections see its level, known
	// only after the where messages: None until then.
	c.set.ctx = context.WithValue(c.set.ctx, peerSharingKey{}, c.level)
	c.set.level = c.level
	s.mu.Lock()
	s.sides[c.secret] = c.set
	s.mu.Unlock()
	return sessionMsg{secret: c.secret, max: uint16(min(s.o.limits.MaxSideConns, math.MaxUint16))}, nil
}

// attach is the offer's step for a side connection, once its peer has
// authenticated: it attaches this connection to the set of the session
// whose secret a names (c.attached, c.target), or returns the refusal.
func (c *serverConn) attach(a attachMsg) error {
	c.attaching = true
	s := c.s
	s.mu.RLock()
	target := s.sides[a.secret]
	s.mu.RUnlock()
	if target == nil {
		return Errorf(Unauthenticated, "no session has this secret")
	}
	// The client attaches as soon as its side of the where messages is
	// done, which may be before the node has read its answer: wait for
	// the session's level, or a call on this connection would see None
	// and be refused (a loaded CI machine showed it: a replay sample by
	// reference refused after a node restart).
	if target.level != nil {
		t := time.NewTimer(s.o.limits.HandshakeTimeout)
		defer t.Stop()
		select {
		case <-target.level.decided:
		case <-target.ctx.Done():
			return Errorf(Unavailable, "the session ended before its handshake did")
		case <-t.C:
			return Errorf(Unavailable, "the session's handshake did not finish")
		}
	}
	var err error
	c.attached, err = target.add(a.id, c.rw)
	c.target = target
	return err
}

// dropSideSet unregisters the session's set of side connections, if it
// has one, and closes them.
func (c *serverConn) dropSideSet() {
	if c.set != nil {
		c.s.mu.Lock()
		delete(c.s.sides, c.secret)
		c.s.mu.Unlock()
		c.set.close()
	}
}

// startAttached hands a side connection whose handshake passed to the
// session it attached to: it lives in that session's set from now on
// (read by serveSide, server_side.go), and closes with the session.
func (c *serverConn) startAttached() {
	c.rw.SetDeadline(time.Time{})
	c.log.Debug("rpc: side connection attached", "id", c.attached.id)
	c.target.start(c.attached)
}

// serveSession starts the yamux session of a main connection whose
// handshake passed, registers it with the server (Close closes it) and
// stops counting it among the handshakes, says once how much the peer
// shares, and accepts its streams (acceptStreams) until the session ends.
// Then, or when it cannot start, it closes the session and the
// connection, and drops the session's side connections.
func (c *serverConn) serveSession(peer peerInfo) {
	s, log := c.s, c.log
	sharing, why := peer.sharing, peer.why
	c.rw.SetDeadline(time.Time{})
	fc := newFrameConn(c.rw)
	sess, err := yamux.Server(fc, s.o.yamuxConfig(false))
	if err != nil {
		c.dropSideSet()
		c.rw.Close()
		return
	}
	pc := &peerConn{sess: sess, fc: fc, version: peer.version, remote: c.remote, sharing: sharing, level: c.level, side: c.set, room: make(chan struct{}, 1)}
	if pc.bodies = newBudget(s.o.limits.MaxBodyBytes); c.set != nil {
		pc.bodies = c.set.bodies // one budget for the session, whichever connection a body comes on
	}
	defer c.dropSideSet()
	var cancelPC context.CancelFunc
	if testHookBeforeLevel != nil {
		testHookBeforeLevel()
	}
	c.level.set(sharing)
	pc.ctx, cancelPC = context.WithCancel(context.WithValue(s.ctx, peerSharingKey{}, c.level))
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
	c.handshakeDone()
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
	s.acceptStreams(pc, log)
}

// acceptStreams accepts pc's streams and serves each on a goroutine of its
// own (serveStream) until the session ends. Streams past MaxStreamsPerPeer
// being served each serve one refusal; past twice the limit it accepts
// none until one ends.
func (s *Server) acceptStreams(pc *peerConn, log *slog.Logger) {
	limit := int32(s.o.limits.MaxStreamsPerPeer)
	for {
		// Past twice the limit (the limit's streams and as many refusals)
		// take no more: yamux's accept backlog holds the next ones and
		// resets the rest at once, before they cost a goroutine and buffers.
		for pc.active.Load() >= 2*limit {
			select {
			case <-pc.room:
			case <-pc.sess.CloseChan():
				return
			}
		}
		st, err := pc.sess.AcceptStream()
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

// testHookBeforeLevel, when a test sets it, runs just before a main
// connection's level is set: a slow node, for TestSide_AttachWaitsForTheLevel.
var testHookBeforeLevel func()
