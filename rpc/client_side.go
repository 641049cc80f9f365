package rpc

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// A client's side connections to one session: the pool a call or message
// stream checks one out of (sidePool, clientConn.getSide) and the dial of
// a new one (Client.dialSide). What both ends share (the messages,
// sideConn, the writes) is in side.go.

// sidePool is a client's side connections to one session: idle ones, and
// the count of those open or being dialed, at most max.
type sidePool struct {
	dial func(ctx context.Context, id uint32) (net.Conn, error)
	max  int

	mu      sync.Mutex
	idle    []*sideConn
	all     map[*sideConn]struct{}
	open    int // open or being dialed
	nextID  uint32
	retryAt time.Time // no dial before this
	closed  bool
}

func newSidePool(max int, dial func(ctx context.Context, id uint32) (net.Conn, error)) *sidePool {
	return &sidePool{dial: dial, max: max, all: map[*sideConn]struct{}{}}
}

// get checks out a side connection: an idle one, else a new one if the
// pool is under its limit and the last dial did not fail within
// sideRetry. It returns nil when there is none to have (the caller goes
// in-band); a dial is bounded by ctx.
func (p *sidePool) get(ctx context.Context) *sideConn {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil
		}
		if n := len(p.idle); n > 0 {
			sc := p.idle[n-1]
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			if sc.unwatch() && sc.idleAlive() {
				return sc
			}
			sc.kill()
			continue
		}
		if p.open >= p.max || time.Now().Before(p.retryAt) {
			p.mu.Unlock()
			return nil
		}
		p.open++
		p.nextID++
		id := p.nextID
		p.mu.Unlock()

		conn, err := p.dial(ctx, id)
		p.mu.Lock()
		if err != nil {
			p.open--
			if ctx.Err() == nil {
				p.retryAt = time.Now().Add(sideRetry)
			}
			p.mu.Unlock()
			return nil
		}
		if p.closed {
			p.open--
			p.mu.Unlock()
			conn.Close()
			return nil
		}
		sc := newSideConn(id, conn, true, p.drop)
		p.all[sc] = struct{}{}
		p.mu.Unlock()
		return sc
	}
}

// put returns a side connection its holder is done with: to the pool if
// ok (it is in step: every body on it read and written whole), else it is
// closed.
func (p *sidePool) put(sc *sideConn, ok bool) {
	if !ok || sc.dead.Load() {
		sc.kill()
		return
	}
	sc.conn.SetDeadline(time.Time{})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		sc.kill()
		return
	}
	sc.watch()
	p.idle = append(p.idle, sc)
	p.mu.Unlock()
}

// drop forgets a side connection that was closed.
func (p *sidePool) drop(sc *sideConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.all[sc]; !ok {
		return
	}
	delete(p.all, sc)
	p.open--
	for i, x := range p.idle {
		if x == sc {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			break
		}
	}
}

// close closes every side connection, idle or held (their holders' reads
// and writes fail), and makes get return nil from then on.
func (p *sidePool) close() {
	p.mu.Lock()
	p.closed = true
	all := make([]*sideConn, 0, len(p.all))
	for sc := range p.all {
		all = append(all, sc)
	}
	p.mu.Unlock()
	for _, sc := range all {
		sc.kill()
	}
}

// size returns how many side connections are open or being dialed.
func (p *sidePool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// dialSide opens a side connection to the session of cc: TCP, TLS if
// configured, and the handshake with an attach message, within the
// handshake timeout and ctx.
func (c *Client) dialSide(ctx context.Context, cc *clientConn, id uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetWriteBuffer(sideBuffer)
	}
	deadline := time.Now().Add(c.o.limits.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	var rw net.Conn = conn
	if c.o.tls != nil {
		tc := tls.Client(conn, c.o.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		rw = tc
	}
	if _, err := clientHandshakeAttach(rw, cc.version, rootSide{fsid: c.fsid}, c.o.token, &attachMsg{id: id, secret: cc.session.secret}); err != nil {
		rw.Close()
		c.o.log.Debug("rpc: side connection refused", "addr", c.addr, "err", err)
		return nil, err
	}
	rw.SetDeadline(time.Time{})
	return rw, nil
}

// getSide checks out a side connection for a call or stream that may move
// a large body, or returns nil (the bodies then go in-band).
func (cc *clientConn) getSide(ctx context.Context, want bool) *sideConn {
	if !want || cc.side == nil {
		return nil
	}
	return cc.side.get(ctx)
}
