package rpc

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// The Client and its connection to one node: Dial, and the dial (TCP, TLS,
// the handshake, yamux) a call makes when there is no live connection. The
// call path is in client_call.go, message streams in client_stream.go,
// side connections in client_side.go.

// Client calls the handlers of one node. It keeps one connection (a yamux
// session) to the node and a pool of streams on it, so a call costs no
// round trip to set up; it dials again, transparently, when the connection
// has died (the node restarted, say) and a new call comes.
//
// A call is never retried once its request may have reached the node: a
// call cut off by the connection failing returns an error matching
// ErrUnavailable, and the caller decides.
//
// A Client is safe for concurrent use; calls run in parallel on their own
// streams. Close it when done.
type Client struct {
	addr string
	o    options
	fsid FSID   // this side's root identity; zero without a root
	host hostID // this side's kernel and root mount
	root string // this side's root, absolute

	calls chan struct{} // a token per call in flight; MaxStreamsPerPeer of them

	mu      sync.Mutex
	cur     *clientConn
	dialing chan struct{} // closed when the dial in progress ends
	closed  bool
}

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = &Error{Code: Unavailable, Msg: "client is closed"}

// clientConn is one connection and its idle streams.
type clientConn struct {
	sess    *yamux.Session
	fc      *frameConn
	version uint8 // the protocol version the connection speaks
	link    link
	dog     *watchdog
	session sessionMsg // version 3: how side connections attach
	side    *sidePool  // nil: no side connections (client_side.go)

	mu   sync.Mutex
	idle []*clientStream
}

// Dial connects to the node at addr ("host:port") and returns a Client for
// it. Options: WithRoot (this side's view of the shared root, so TensorDicts
// under it travel as references when the node shares it), WithToken,
// WithTLS, WithLogger, WithWindow, WithKeepAlive, WithCompression,
// WithSideConnections, WithCoherentStorage (probe a filesystem shared with
// another machine for coherent mappings), WithLimits (the sizes this client
// accepts in responses, how many side connections it opens; a negative one
// is ErrInvalidArgument). Dial fails if the node cannot be reached or
// refuses the handshake (errors.Is(err, ErrUnauthenticated) for a token
// problem); ctx bounds the dial.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	c := &Client{addr: addr, o: newOptions(opts)}
	var err error
	if c.o.limits, err = c.o.limits.validate(); err != nil {
		return nil, err
	}
	c.calls = make(chan struct{}, c.o.limits.MaxStreamsPerPeer)
	if cfg := c.o.tls; cfg != nil && cfg.ServerName == "" && !cfg.InsecureSkipVerify {
		// As tls.Dial does: verify the certificate against the name dialled.
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, Errorf(InvalidArgument, "address %q: %w", addr, err)
		}
		c.o.tls = cfg.Clone()
		c.o.tls.ServerName = host
	}
	if c.o.root != "" {
		if c.root, c.fsid, err = peekRoot(c.o.root); err != nil {
			return nil, err
		}
	}
	c.host = localHostID(c.root)
	if c.o.bootID != [16]byte{} {
		c.host.boot = c.o.bootID
	}
	if _, err := c.conn(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Addr returns the node's address.
func (c *Client) Addr() string { return c.addr }

// SharedFS reports whether the current connection's node shares this
// client's page cache (Sharing is Coherent), so that TensorDicts under the
// root, and anything a service changes in place, travel as references. It
// dials if there is no connection.
func (c *Client) SharedFS(ctx context.Context) (bool, error) {
	cc, err := c.conn(ctx)
	if err != nil {
		return false, err
	}
	return cc.link.shared, nil
}

// Sharing returns how much of the node's root the current connection
// shares with this client (Coherent, Storage or None; see Sharing), as the
// handshake decided it (and the coherence probe, WithCoherentStorage). Services send references to files changed in
// place at Coherent only, and to write-once files at Storage too. It dials
// if there is no connection; a reconnection decides again.
func (c *Client) Sharing(ctx context.Context) (Sharing, error) {
	cc, err := c.conn(ctx)
	if err != nil {
		return None, err
	}
	return cc.link.sharing, nil
}

// Close closes the connection; calls in flight fail with ErrUnavailable and
// later calls with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.cur != nil {
		c.cur.sess.Close()
		c.cur = nil
	}
	return nil
}

// conn returns a live connection, dialing if there is none. Concurrent
// callers share one dial; each waits at most until its own ctx ends.
func (c *Client) conn(ctx context.Context) (*clientConn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if c.cur != nil && !c.cur.sess.IsClosed() {
			cc := c.cur
			c.mu.Unlock()
			return cc, nil
		}
		if ch := c.dialing; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, unreachableError(ctx, "dial "+c.addr, ctx.Err())
			}
		}
		ch := make(chan struct{})
		c.dialing = ch
		c.mu.Unlock()

		cc, err := c.dial(ctx)

		c.mu.Lock()
		c.dialing = nil
		if err == nil {
			if c.closed {
				cc.sess.Close()
				err = ErrClosed
			} else {
				c.cur = cc
			}
		}
		close(ch)
		c.mu.Unlock()
		return cc, err
	}
}

// dial opens a connection: TCP, TLS if configured, the handshake, yamux.
// It offers the newest protocol version, and dials again with an older one
// when the node refuses it but speaks that one.
func (c *Client) dial(ctx context.Context) (*clientConn, error) {
	cc, err := c.dialVersion(ctx, cmp.Or(c.o.version, ProtocolVersion))
	if ve, ok := errors.AsType[*versionError](err); ok {
		c.o.log.Debug("rpc: node speaks an older protocol", "addr", c.addr, "version", ve.version)
		cc, err = c.dialVersion(ctx, ve.version)
	}
	return cc, err
}

// dialVersion opens a connection offering protocol version.
func (c *Client) dialVersion(ctx context.Context, version uint8) (*clientConn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, unreachableError(ctx, "dial "+c.addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	fail := func(err error) (*clientConn, error) {
		conn.Close()
		var e *Error
		if errors.As(err, &e) {
			return nil, err // an *Error, or a *versionError wrapping one
		}
		return nil, unreachableError(ctx, "handshake with "+c.addr, err)
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
			return fail(Errorf(Unauthenticated, "TLS with %s: %w", c.addr, err))
		}
		rw = tc
	}
	peer, err := clientHandshakeVersion(rw, version, rootSide{fsid: c.fsid, root: c.root, host: c.host}, c.o.token)
	if err != nil {
		return fail(err)
	}
	sharing, why := peer.sharing, peer.why
	rw.SetDeadline(time.Time{})
	fc := newFrameConn(rw)
	sess, err := yamux.Client(fc, c.o.yamuxConfig(true))
	if err != nil {
		return fail(err)
	}
	dog := watch(fc, sess, c.o.clientKeepAlive(), c.o.log, c.addr)
	cc := &clientConn{sess: sess, fc: fc, version: peer.version, dog: dog, session: peer.session}
	if sharing == Storage && c.o.coherentStorage {
		// Both sides may have opted in: the filesystem decides.
		if ok, failed := c.probeCoherence(ctx, cc); ok {
			sharing, why = Coherent, "the same files through another page cache, and the filesystem passed the coherence probe (WithCoherentStorage)"
		} else {
			why += "; the coherence probe (WithCoherentStorage) failed: " + failed
		}
	}
	shared := sharing == Coherent
	if c.root != "" && !shared {
		c.o.log.Info("rpc: connected; references to files changed in place are off, bytes travel instead", "addr", c.addr, "sharing", sharing, "why", why)
	} else {
		c.o.log.Debug("rpc: connected", "addr", c.addr, "sharing", sharing, "why", why)
	}
	cc.link = link{shared: shared, sharing: sharing, root: c.root}
	if peer.session.offers() && !c.o.noSide {
		cc.side = newSidePool(min(c.o.limits.MaxSideConns, int(peer.session.max)), func(ctx context.Context, id uint32) (net.Conn, error) {
			return c.dialSide(ctx, cc, id)
		})
		// The session's end, the watchdog's giving up included, closes the
		// side connections too: their holders' reads and writes fail.
		go func() {
			<-sess.CloseChan()
			cc.side.close()
		}()
	}
	return cc, nil
}
