package rpc

import (
	"cmp"
	"context"
	"crypto/tls"
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
