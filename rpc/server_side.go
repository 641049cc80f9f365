package rpc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// A session's side connections on the server: the set of those attached
// to it (sideSet: attach, take for a call or stream, give back, close),
// the reader of each idle one's next request (Server.serveSide), and the
// calls whose requests come on them (Server.sideCall). What both ends
// share (the messages, sideConn, the writes) is in side.go.

// sideSet is a server's side connections of one session.
type sideSet struct {
	max   int
	srv   *Server         // serves the calls whose requests come on the side connections
	log   *slog.Logger    // the session's
	ctx   context.Context // ends with the session
	level *peerLevel      // the session's sharing level; attaches wait until it is decided
	end   context.CancelFunc

	bodies *budget // the session's budget for bodies, shared with its main connection (budget.go)

	mu      sync.Mutex
	conns   map[uint32]*sideConn
	busy    map[uint32]bool
	changed chan struct{} // closed, and replaced, when a held one is given back or dropped
	closed  bool
}

func newSideSet(srv *Server, log *slog.Logger, max int) *sideSet {
	s := &sideSet{max: max, srv: srv, log: log, bodies: newBudget(srv.o.limits.MaxBodyBytes), conns: map[uint32]*sideConn{}, busy: map[uint32]bool{}, changed: make(chan struct{})}
	s.ctx, s.end = context.WithCancel(srv.ctx)
	return s
}

// signal wakes the takers waiting for a held side connection; s.mu is held.
func (s *sideSet) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// add attaches conn as side connection id, or returns the refusal.
// An idle one the peer has closed is gone already: its reader saw the end.
func (s *sideSet) add(id uint32, conn net.Conn) (*sideConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A client attaches past the limit only when it holds fewer than the
	// limit itself: one it closed is still counted here until this side's
	// reader sees its end, a moment later. Wait for that drop, briefly,
	// before refusing (TestSide_DeadIdleConns failed 1 run in 30 without).
	if !s.closed && s.conns[id] == nil && len(s.conns) >= s.max {
		timer := time.NewTimer(attachRoomWait)
		for !s.closed && len(s.conns) >= s.max {
			ch := s.changed
			s.mu.Unlock()
			select {
			case <-ch:
			case <-timer.C:
			}
			s.mu.Lock()
			if !timer.Stop() {
				break // waited long enough: refuse
			}
			timer.Reset(attachRoomWait)
		}
		timer.Stop()
	}
	switch {
	case s.closed:
		return nil, Errorf(Unavailable, "the session has ended")
	case s.conns[id] != nil:
		return nil, Errorf(AlreadyExists, "side connection %d is attached already", id)
	case len(s.conns) >= s.max:
		return nil, Errorf(ResourceExhausted, "the session has %d side connections, its limit", s.max)
	}
	sc := newSideConn(id, conn, false, s.drop)
	sc.ctx, sc.cancel = context.WithCancel(s.ctx)
	s.conns[id] = sc
	return sc, nil
}

// attachRoomWait is how long an attach past a session's limit waits for
// one of its side connections to be dropped.
const attachRoomWait = time.Second

// take checks out side connection id for a call or message stream that
// names it: nil if there is none. One still held by the call before waits
// until that call gives it back, until deadline: the client may name it
// again as soon as it has read the last of that call's answer, a moment
// before the node's side of the call is done with it.
func (s *sideSet) take(id uint32, deadline time.Time) *sideConn {
	s.mu.Lock()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for s.busy[id] && s.conns[id] != nil {
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			// Held past the deadline: the client names one it holds
			// elsewhere. Closed, so that whoever waits on it stops.
			s.mu.Lock()
			sc := s.conns[id]
			s.mu.Unlock()
			if sc != nil {
				sc.kill()
			}
			return nil
		}
		s.mu.Lock()
	}
	sc := s.conns[id]
	if sc == nil {
		s.mu.Unlock()
		return nil
	}
	s.busy[id] = true
	s.signal()
	s.mu.Unlock()
	if !sc.unwatch() {
		s.mu.Lock()
		delete(s.busy, id)
		s.signal()
		s.mu.Unlock()
		return nil
	}
	return sc
}

// put ends a call's or stream's hold of sc: idle again if ok, else closed.
func (s *sideSet) put(sc *sideConn, ok bool) {
	if !ok || sc.dead.Load() {
		sc.kill()
		return
	}
	sc.conn.SetDeadline(time.Time{})
	s.mu.Lock()
	delete(s.busy, sc.id)
	s.signal()
	s.watch(sc)
	s.mu.Unlock()
}

// start begins reading requests from a side connection that has just
// attached.
func (s *sideSet) start(sc *sideConn) {
	s.mu.Lock()
	s.watch(sc)
	s.mu.Unlock()
}

// watch starts the reader of an idle side connection's next request
// (Server.serveSide), unless one runs; s.mu is held. A message stream that
// takes the connection stops it (sideConn.unwatch).
func (s *sideSet) watch(sc *sideConn) {
	// busy: a message stream took it between its attach and start, and
	// is unwatching it outside s.mu (sideConn.unwatch writes watchDone
	// there): it starts a reader when given back. So busy is asked first,
	// and watchDone only of a connection no taker holds.
	if s.closed || s.busy[sc.id] || sc.dead.Load() || sc.watchDone != nil {
		return
	}
	done := make(chan struct{})
	sc.watchDone = done
	sc.conn.SetReadDeadline(time.Now().Add(s.srv.o.limits.IdleTimeout))
	s.srv.wg.Add(1) // the session's serveConn holds the group while the set is open
	go s.srv.serveSide(s, sc, done)
}

func (s *sideSet) drop(sc *sideConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns[sc.id] == sc {
		delete(s.conns, sc.id)
		delete(s.busy, sc.id)
		s.signal()
	}
}

// close closes every side connection and refuses new ones.
func (s *sideSet) close() {
	s.mu.Lock()
	s.closed = true
	s.end()
	all := make([]*sideConn, 0, len(s.conns))
	for _, sc := range s.conns {
		all = append(all, sc)
	}
	s.mu.Unlock()
	for _, sc := range all {
		sc.kill()
	}
}

// len returns how many side connections are attached.
func (s *sideSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// newSecret returns a random session secret.
func newSecret() ([32]byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return b, fmt.Errorf("rpc: session secret: %w", err)
	}
	return b, nil
}

// serveSide reads the requests that come on side connection sc, one after
// another, and starts each call (sideCall); done is closed when it returns.
// It reads the next request while a call runs, so it sees the caller close
// the connection at once (which cancels the call: sc.ctx); a request that
// comes before the call before is done waits for it. It returns when the
// connection ends, breaks the protocol, idles out (Limits.IdleTimeout), or
// is taken by a message stream (sideConn.unwatch), with what it read left
// in sc.pend for the stream. It reads nothing while sc.pend holds bytes: a
// message stream's reader read them past its end (sideConn.unread).
func (s *Server) serveSide(set *sideSet, sc *sideConn, done chan struct{}) {
	defer s.wg.Done()
	defer close(done)
	var prev chan struct{} // the call in progress
	for {
		if len(sc.pend) == 0 {
			n, err := sc.conn.Read(sc.one[:])
			if n == 0 {
				if errors.Is(err, os.ErrDeadlineExceeded) && sc.stopping.Load() {
					return // taken by a message stream
				}
				sc.kill() // closed, reset or idle: ends the call in progress
				return
			}
			sc.pend = sc.one[:1]
		}
		if prev != nil {
			<-prev
			prev = nil
		}
		if sc.pend[0] != sideCallTag {
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
		sc.pend = sc.pend[1:] // the tag
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
	in := &incoming{method: hdr.Method, args: args, body: newBodyReader(sc.br, hdr.BodyLen, hdr.RawLen), res: s.resolverFor(set.level),
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
