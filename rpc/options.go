package rpc

import (
	"cmp"
	"crypto/tls"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/hashicorp/yamux"
)

// Limits bound what one peer can make a server do. A peer that breaks one
// gets an error (a refused call, or its connection closed when it breaks
// the message format); the server goes on serving everyone else.
//
// A zero field takes its default (DefaultLimits), so Limits{MaxBodyBytes:
// 1 << 20} changes that limit alone; NewServer and Dial refuse a negative
// one.
type Limits struct {
	MaxHeaderBytes    int           // a message header; default 64 KiB
	MaxArgBytes       int           // a call's msgpack argument or result; default 16 MiB
	MaxBodyBytes      int64         // a call's or message's bulk bytes, default 4 GiB; also what a server allocates at once for one peer's bodies before they arrive (more wait)
	MaxStreamsPerPeer int           // concurrent calls (streams) of one connection, default 256: a server refuses more; a client's calls past it wait their turn (bounded by their context)
	HandshakeTimeout  time.Duration // a new connection's handshake; default 10 s
	IdleTimeout       time.Duration // an idle pooled stream is closed after it; default 2 min

	// Message streams (RegisterStream, OpenStream). A server refuses a
	// peer's streams past MaxMessageStreams with ResourceExhausted (they
	// count against MaxStreamsPerPeer too). Each side of a stream reads
	// messages ahead of its receiver up to MaxStreamBuffer bytes (always at
	// least one message), then stops reading, so its sender waits on the
	// yamux window.
	MaxMessageStreams int   // default 64; a server's limit
	MaxStreamBuffer   int64 // default 8 MiB; both sides

	// Side connections (protocol version 3): a server takes at most
	// MaxSideConns for each session and refuses more with
	// ResourceExhausted; a client opens at most this many, and no more
	// than its node takes. Default 8.
	MaxSideConns int

	// A server gives a request's argument and body, and a response, the
	// time to move their bytes at MinTransferRate plus TransferGrace, so a
	// peer that stalls or trickles holds a stream for a bounded time; a
	// stream over MaxStreamsPerPeer has TransferGrace to send its request.
	MinTransferRate int64         // bytes per second; default 1 MB/s
	TransferGrace   time.Duration // default 10 s
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
		MaxMessageStreams: 64,
		MaxStreamBuffer:   8 << 20,
		MaxSideConns:      8,
		MinTransferRate:   1_000_000,
		TransferGrace:     10 * time.Second,
	}
}

// validate returns l with its zero fields set to their defaults, or an
// error matching ErrInvalidArgument that names a negative field.
func (l Limits) validate() (Limits, error) {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxHeaderBytes", int64(l.MaxHeaderBytes)},
		{"MaxArgBytes", int64(l.MaxArgBytes)},
		{"MaxBodyBytes", l.MaxBodyBytes},
		{"MaxStreamsPerPeer", int64(l.MaxStreamsPerPeer)},
		{"HandshakeTimeout", int64(l.HandshakeTimeout)},
		{"IdleTimeout", int64(l.IdleTimeout)},
		{"MaxMessageStreams", int64(l.MaxMessageStreams)},
		{"MaxStreamBuffer", l.MaxStreamBuffer},
		{"MaxSideConns", int64(l.MaxSideConns)},
		{"MinTransferRate", l.MinTransferRate},
		{"TransferGrace", int64(l.TransferGrace)},
	} {
		if f.v < 0 {
			return l, Errorf(InvalidArgument, "Limits.%s is %d; it must not be negative (0 takes the default)", f.name, f.v)
		}
	}
	d := DefaultLimits()
	return Limits{
		MaxHeaderBytes:    cmp.Or(l.MaxHeaderBytes, d.MaxHeaderBytes),
		MaxArgBytes:       cmp.Or(l.MaxArgBytes, d.MaxArgBytes),
		MaxBodyBytes:      cmp.Or(l.MaxBodyBytes, d.MaxBodyBytes),
		MaxStreamsPerPeer: cmp.Or(l.MaxStreamsPerPeer, d.MaxStreamsPerPeer),
		HandshakeTimeout:  cmp.Or(l.HandshakeTimeout, d.HandshakeTimeout),
		IdleTimeout:       cmp.Or(l.IdleTimeout, d.IdleTimeout),
		MaxMessageStreams: cmp.Or(l.MaxMessageStreams, d.MaxMessageStreams),
		MaxStreamBuffer:   cmp.Or(l.MaxStreamBuffer, d.MaxStreamBuffer),
		MaxSideConns:      cmp.Or(l.MaxSideConns, d.MaxSideConns),
		MinTransferRate:   cmp.Or(l.MinTransferRate, d.MinTransferRate),
		TransferGrace:     cmp.Or(l.TransferGrace, d.TransferGrace),
	}, nil
}

// transferDeadline returns when n bytes, starting at now, must have moved:
// now plus TransferGrace plus n at MinTransferRate (raft's TimeoutScale),
// never before now + TransferGrace and, for any n, not past the time
// Time.Add can represent. l must be validated (MinTransferRate > 0).
func (l *Limits) transferDeadline(now time.Time, n int64) time.Time {
	d := l.TransferGrace
	if n > 0 {
		// In floating point: n * time.Second overflows int64 past 9.2 GB.
		t := float64(n) / float64(l.MinTransferRate) * float64(time.Second)
		if t >= float64(math.MaxInt64-d) {
			return now.Add(math.MaxInt64)
		}
		d += time.Duration(t)
	}
	return now.Add(d)
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
	noLZ4     bool          // WithCompression(false)
	noSide    bool          // WithSideConnections(false)
	version   uint8         // the newest protocol version to speak; 0: ProtocolVersion (tests set it)
	observer  Observer      // WithObserver; nil: none

	coherentStorage bool     // WithCoherentStorage
	bootID          [16]byte // tests: a client's boot id as its handshake tells it (withBootID); zero: the kernel's

	onAuthFailure func(remote string, err error) // WithAuthFailure
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

// WithAuthFailure has a server call fn for each peer whose handshake it
// refused because the peer did not authenticate: it sent no token, a
// wrong one (a client whose token differs from the server's), or one to a
// server without a token. fn gets the peer's address and the refusal (an
// *Error, code Unauthenticated); it runs on the connection's goroutine
// after the refusal was written, and must not block. Server only.
func WithAuthFailure(fn func(remote string, err error)) Option {
	return func(o *options) { o.onAuthFailure = fn }
}

// WithTLS runs each connection inside TLS with cfg (a server needs a
// certificate; a client, what it needs to verify it). The token handshake,
// when configured, runs inside TLS. Both sides.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithLogger sets where the package logs (connections opened, refused and
// closed, handler failures). The default discards. Both sides.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithLimits sets the limits: on a server, what peers may send it; on a
// client, the header, result and body sizes it accepts in responses and
// its handshake timeout. Zero fields take their defaults. Both sides.
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

// WithCompression turns lz4 compression of bytes-mode bodies on (the
// default) or off. On, a side compresses a body it sends on a protocol
// version 2 connection when a sample of it shrinks enough (compress.go);
// off, it sends every body as it is, and a client also asks its node to
// answer uncompressed (a server with it off answers uncompressed anyway).
// Uncompressed does the same for one call or stream. References never are
// compressed: they are not in the body. Both sides.
func WithCompression(on bool) Option { return func(o *options) { o.noLZ4 = !on } }

// WithSideConnections turns side connections on (the default) or off. On
// a protocol version 3 connection, a body of 256 KiB or more (a call's
// request or response, a stream's message) travels on a side connection:
// a second TCP (and TLS) connection to the node, authenticated as the
// first, that one call or message stream holds at a time, so the body is
// written straight from the tensors and read straight into them instead of
// being copied through yamux. A client opens them as calls need them, up
// to Limits.MaxSideConns, and sends bodies in-band when none is to be had.
// Off, a server offers none and a client opens none: every body goes
// through yamux. Both sides.
func WithSideConnections(on bool) Option { return func(o *options) { o.noSide = !on } }

// WithCoherentStorage opts in to taking a filesystem for coherent when it
// shows it is: one that keeps memory mappings coherent across the machines
// (or mounts) that share it, as Lustre says it does. NFS, CephFS and GPFS
// say they do not, and FUSE filesystems do not either (two bindfs views of
// one folder fail the check in the tests).
//
// Without it a connection whose two sides see the same root through
// different page caches (another machine, another mount) is at Storage
// level: references to what changes in place travel as bytes. With it on
// both sides, the client probes such a connection at each Dial: a store
// through one side's mapping of a probe file must show in the other side's
// existing mapping within 50 ms, both ways (docs/protocol.md, "Coherence
// probe"). When it does, both sides take the connection for Coherent; when
// it does not, it stays at Storage and the client logs why, once, at
// INFO. Both sides: a node with it answers the probe, a client with it
// runs it.
func WithCoherentStorage() Option { return func(o *options) { o.coherentStorage = true } }

// withBootID has a client tell its handshake that it runs on the kernel
// with boot id id: tests play a client on another machine over one page
// cache with it.
func withBootID(id [16]byte) Option { return func(o *options) { o.bootID = id } }

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
