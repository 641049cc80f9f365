package rpc

import (
	"cmp"
	"crypto/tls"
	"io"
	"log/slog"
	"time"

	"github.com/hashicorp/yamux"
)

// Limits bound what one peer can make a server do. A peer that breaks one
// gets an error (a refused call, or its connection closed when it breaks
// the message format); the server goes on serving everyone else.
type Limits struct {
	MaxHeaderBytes    int           // a message header; default 64 KiB
	MaxArgBytes       int           // a call's msgpack argument or result; default 16 MiB
	MaxBodyBytes      int64         // a call's bulk bytes; default 4 GiB
	MaxStreamsPerPeer int           // concurrent calls (streams) of one connection; default 256
	HandshakeTimeout  time.Duration // a new connection's handshake; default 10 s
	IdleTimeout       time.Duration // an idle pooled stream is closed after it; default 2 min
}

// DefaultLimits returns the limits a Server uses unless given others.
func DefaultLimits() Limits {
	return Limits{
		MaxHeaderBytes:    64 << 10,
		MaxArgBytes:       16 << 20,
		MaxBodyBytes:      4 << 30,
		MaxStreamsPerPeer: 256,
		HandshakeTimeout:  10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

// Option configures a Server (NewServer) or a Client (Dial). Each option
// says which side reads it; the other ignores it.
type Option func(*options)

type options struct {
	root      string
	token     []byte
	tls       *tls.Config
	log       *slog.Logger
	limits    Limits
	window    uint32
	keepAlive time.Duration // 0: the side's default (defaultServerKeepAlive, defaultClientKeepAlive)
}

func newOptions(opts []Option) options {
	o := options{
		log:    slog.New(slog.DiscardHandler),
		limits: DefaultLimits(),
		window: 16 << 20,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithRoot sets the shared root: the folder, on a filesystem other nodes
// may share, under which references are made (client) and resolved
// (server). Its identity (ReadFSID) decides whether two nodes share it.
// Without a root, every TensorDict travels as bytes. Both sides.
func WithRoot(dir string) Option { return func(o *options) { o.root = dir } }

// WithToken sets the shared secret both sides prove they know (HMAC
// challenge-response; the token itself never crosses the wire). A server
// with a token refuses clients without it, and a client with a token
// refuses servers that cannot prove it. Both sides.
func WithToken(token []byte) Option {
	return func(o *options) { o.token = append([]byte(nil), token...) }
}

// WithTLS runs each connection inside TLS with cfg (a server needs a
// certificate; a client, what it needs to verify it). The token handshake,
// when configured, runs inside TLS. Both sides.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithLogger sets where the package logs (connections opened, refused and
// closed, handler failures). The default discards. Both sides.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithLimits sets the limits: on a server, what peers may send it; on a
// client, the header, result and body sizes it accepts in responses. Both
// sides.
func WithLimits(l Limits) Option { return func(o *options) { o.limits = l } }

// WithWindow sets yamux's per-stream receive window (at least 256 KiB;
// default 16 MiB). Larger windows move bulk bytes faster. Both sides.
func WithWindow(bytes uint32) Option { return func(o *options) { o.window = bytes } }

// WithKeepAlive sets how quickly a dead or unreachable peer is found.
//
// A client pings its node once the node has been silent for d (default
// 1 s), calls a node silent for 1.5d unreachable (a call whose deadline
// passes then fails with Unavailable, not DeadlineExceeded), and closes a
// connection whose node has been silent for 5d, failing the calls on it
// with Unavailable; the next call dials again. A server pings each client
// every d (default 10 s) and drops one that does not answer within 30 s.
// Both sides; d < 0 turns the pings off.
func WithKeepAlive(d time.Duration) Option { return func(o *options) { o.keepAlive = d } }

// Keep-alive defaults (WithKeepAlive).
const (
	defaultServerKeepAlive = 10 * time.Second
	defaultClientKeepAlive = time.Second
)

// yamuxConfig returns the yamux configuration for o on a server or, with
// client set, a client. A client's liveness is the watchdog's job, so its
// yamux sends no pings of its own; it still answers the server's.
func (o *options) yamuxConfig(client bool) *yamux.Config {
	c := yamux.DefaultConfig()
	c.AcceptBacklog = max(o.limits.MaxStreamsPerPeer, 1)
	c.MaxStreamWindowSize = max(o.window, 256<<10)
	c.EnableKeepAlive = !client && o.keepAlive >= 0
	if c.EnableKeepAlive {
		c.KeepAliveInterval = cmp.Or(o.keepAlive, defaultServerKeepAlive)
	}
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamCloseTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}
