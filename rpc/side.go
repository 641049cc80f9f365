package rpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Side connections (docs/protocol.md, "Side connections"; protocol
// version 3).
//
// yamux copies every frame's body on both sides (its send loop copies a
// write into a frame; its receive loop buffers a frame before the stream's
// reader copies it out), which held bulk transfers to 0.6-0.7 of what
// loopback TCP does. So a large body does not go through yamux: the
// handshake of a version 3 session gives the client a random session
// secret, and the client opens side connections, fresh TCP (and TLS)
// connections that authenticate as the main one does and then attach to
// the session by its secret. A call or a message stream checks one out of
// the client's pool for its own use (never two at once, so no body waits
// behind another's). A call then sends its whole request there (a tag
// byte, header, argument, body) and reads its whole answer there, and the
// node reads requests from each idle side connection (Server.serveSide); a
// message stream's header in the yamux stream says that its opening body
// follows on the side connection, and its frames go there after it.
// Bodies are written with one writev straight from the tensors and read
// straight into the receiver's tensors. Everything, when no side
// connection is available, stays in the yamux stream: side connections
// are an optimisation, never a new way to fail.
//
// This file holds what both ends share: the session and attach messages,
// sideConn, and the writes of whole messages and bodies. The client's pool
// is in client_side.go, the server's set and its readers in server_side.go.

const (
	sessionSize = 40 // the session message
	attachSize  = 40 // the attach message

	// sideMin is the smallest body sent on a side connection: below it the
	// copies yamux makes cost less than a second system call.
	sideMin = 256 << 10

	// sideBuffer is a side connection's socket send buffer (the kernel
	// caps it: net.core.wmem_max).
	sideBuffer = 4 << 20

	// sideRetry is how long a client waits, after a side connection could
	// not be dialed or was refused, before it dials another.
	sideRetry = time.Second
)

// sessionMsg ends the handshake of a version 3 main connection, server to
// client: 40 bytes,
//
//	0  32 session secret, random; all zero: the node takes no side connections
//	32 2  the most side connections the node takes for the session, big-endian
//	34 6  reserved, zero
type sessionMsg struct {
	secret [32]byte
	max    uint16
}

func (m sessionMsg) marshal() []byte {
	b := make([]byte, sessionSize)
	copy(b, m.secret[:])
	binary.BigEndian.PutUint16(b[32:], m.max)
	return b
}

// offers reports whether the session takes side connections.
func (m sessionMsg) offers() bool { return m.secret != [32]byte{} && m.max > 0 }

// parseSession decodes a session message; nonzero reserved bytes are
// malformed.
func parseSession(b []byte) (sessionMsg, error) {
	var m sessionMsg
	if len(b) != sessionSize {
		return m, fmt.Errorf("%w: session message of %d bytes", errHandshake, len(b))
	}
	for _, c := range b[34:] {
		if c != 0 {
			return m, fmt.Errorf("%w: reserved bits set in the session message", errHandshake)
		}
	}
	copy(m.secret[:], b)
	m.max = binary.BigEndian.Uint16(b[32:])
	return m, nil
}

// attachMsg follows a side connection's hello (and proof), client to
// server: 40 bytes,
//
//	0 4  the side connection's id, big-endian, nonzero, unique in the session
//	4 4  reserved, zero
//	8 32 the session's secret
type attachMsg struct {
	id     uint32
	secret [32]byte
}

func (a attachMsg) marshal() []byte {
	b := make([]byte, attachSize)
	binary.BigEndian.PutUint32(b, a.id)
	copy(b[8:], a.secret[:])
	return b
}

// parseAttach decodes an attach message: an id of 0 or nonzero reserved
// bytes are malformed (errHandshake).
func parseAttach(b []byte) (attachMsg, error) {
	var a attachMsg
	if len(b) != attachSize {
		return a, fmt.Errorf("%w: attach message of %d bytes", errHandshake, len(b))
	}
	a.id = binary.BigEndian.Uint32(b)
	if a.id == 0 {
		return a, fmt.Errorf("%w: side connection id 0", errHandshake)
	}
	if binary.BigEndian.Uint32(b[4:]) != 0 {
		return a, fmt.Errorf("%w: reserved bits set in the attach message", errHandshake)
	}
	copy(a.secret[:], b[8:])
	return a, nil
}

// sideConn is one side connection, on either end. It is idle (in a
// client's pool, or a server's set and not named by a call) or held by one
// call or message stream. An idle side connection has nothing to read (a
// client's) or only the next request or stream frame (a server's), so one
// the peer has closed can be told, and is dropped from its pool or set: a
// client looks into the socket (peek) before it reuses one, or, where peek
// cannot tell (TLS, systems without it), a watcher goroutine reads it; a
// node always has a goroutine reading its next request (sideSet.watch),
// which sees its end at once.
type sideConn struct {
	id     uint32
	conn   net.Conn      // TCP, or TLS over it
	client bool          // the client's end
	raw    net.Conn      // what peek looks into; nil: watched by a goroutine instead
	br     *bufio.Reader // a client's: the answers of the calls that hold it

	// Bytes read from the connection ahead of its holder, which Read
	// returns first: the byte the watcher read into one (a node's: the
	// first of the next request or stream frame), or what a message
	// stream's reader had read past the caller's end frame when it gave
	// the connection back (the caller's next request: unread).
	pend []byte
	one  [1]byte

	watchDone chan struct{} // closed when the watcher returns; nil when none runs
	stopping  atomic.Bool   // the watcher is being stopped

	once   sync.Once
	dead   atomic.Bool
	onDead func(*sideConn) // drops it from its pool or set

	// A node's: ends when the connection is closed; the parent of the
	// contexts of the calls whose requests come on it.
	ctx    context.Context
	cancel context.CancelFunc
}

// peekState is what peek finds on an idle connection.
type peekState int

const (
	peekUnknown peekState = iota
	peekEmpty
	peekData
	peekClosed
)

func newSideConn(id uint32, conn net.Conn, client bool, onDead func(*sideConn)) *sideConn {
	s := &sideConn{id: id, conn: conn, client: client, onDead: onDead}
	if client {
		s.br = bufio.NewReaderSize(s, 16<<10)
	}
	raw := conn
	if tc, ok := conn.(*tls.Conn); ok {
		// A client's idle TLS connection has nothing to read either: any
		// byte under it (a close_notify alert) means its end. A node's
		// would have the next body's records, which peek cannot tell from
		// an alert.
		raw = nil
		if client {
			raw = tc.NetConn()
		}
	}
	if !client {
		// A node's has a reader of the next request always running
		// (sideSet.watch), which sees its end at once.
		raw = nil
		s.br = bufio.NewReaderSize(s, 32<<10)
	}
	if raw != nil && peek(raw) != peekUnknown {
		s.raw = raw
	}
	return s
}

// idleAlive reports whether an idle connection is still open, as peek
// tells (true when it cannot): a client's must have nothing to read.
func (s *sideConn) idleAlive() bool {
	if s.raw == nil || s.dead.Load() {
		return !s.dead.Load()
	}
	switch peek(s.raw) {
	case peekClosed:
		return false
	case peekData:
		return !s.client
	}
	return true
}

// Read reads the connection, the bytes read ahead of it (pend) first. Only
// the holder reads.
func (s *sideConn) Read(p []byte) (int, error) {
	if len(s.pend) > 0 && len(p) > 0 {
		n := copy(p, s.pend)
		s.pend = s.pend[n:]
		return n, nil
	}
	return s.conn.Read(p)
}

// unread gives b, bytes its holder read from the connection and did not
// use, back to the connection, ahead of the bytes it has not read yet.
// The holder's buffer that b is in must not be used again.
func (s *sideConn) unread(b []byte) {
	if len(s.pend) > 0 {
		b = append(b[:len(b):len(b)], s.pend...)
	}
	s.pend = b
}

// watch starts the watcher of an idle side connection, where peek cannot
// look into it.
func (s *sideConn) watch() {
	if s.raw != nil || s.watchDone != nil || s.dead.Load() || len(s.pend) > 0 || !s.client {
		return
	}
	done := make(chan struct{})
	s.watchDone = done
	go func() {
		defer close(done)
		n, err := s.conn.Read(s.one[:])
		if n == 1 {
			s.pend = s.one[:1]
			if s.client {
				s.kill() // a client's idle side connection has nothing to read
			}
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && s.stopping.Load() {
			return
		}
		s.kill() // closed, reset, or out of step
	}()
}

// unwatch stops the watcher, if one runs, before the connection is used.
// It reports whether the connection is still alive.
func (s *sideConn) unwatch() bool {
	if done := s.watchDone; done != nil {
		s.stopping.Store(true)
		s.conn.SetReadDeadline(time.Unix(1, 0))
		<-done
		s.watchDone = nil
		s.stopping.Store(false)
		s.conn.SetReadDeadline(time.Time{})
	}
	return !s.dead.Load()
}

// kill closes the connection and drops it from its pool or set, once.
func (s *sideConn) kill() {
	s.once.Do(func() {
		s.dead.Store(true)
		s.conn.Close()
		if s.cancel != nil {
			s.cancel()
		}
		if s.onDead != nil {
			s.onDead(s)
		}
	})
}

// writeMessage writes a whole message (length, header, argument, body) to
// a side connection's conn, in one writev when its tensors are in Go
// memory.
func writeMessage(w io.Writer, hdr header, args []byte, b *outBody) error {
	return writeTagged(w, false, hdr, args, b)
}

// sideCallTag is the first byte of a call's request on a side connection:
// the frames of a message stream there begin with a header length, whose
// first byte is never 0xff (a header is at most MaxHeaderBytes).
const sideCallTag = 0xff

// writeTagged is writeMessage, with sideCallTag first if tag is set.
func writeTagged(w io.Writer, tag bool, hdr header, args []byte, b *outBody) error {
	head := make([]byte, 4, 128)
	if tag {
		head = append(head[:0], sideCallTag, 0, 0, 0, 0)
	}
	head = hdr.appendMsgpack(head)
	n := len(head) - 4
	if tag {
		n--
	}
	binary.BigEndian.PutUint32(head[len(head)-n-4:], uint32(n))
	if b == nil {
		bufs := net.Buffers{head, args}
		_, err := bufs.WriteTo(w)
		return err
	}
	return writeBody(w, net.Buffers{head, args}, b)
}

// sideWritten counts the body bytes this process has written to side
// connections: tests read it to see which way bodies went.
var sideWritten atomic.Int64

// writeBody writes prefix and then a body to a side connection's conn:
// compressed, its frame; else its parts, Go-memory tensors in one writev
// straight from their memory (net.Buffers), mapped ones straight from their
// mappings (tensordict's GatherTo: on a connection's descriptor the kernel
// copies, and a truncated file is an error, not a fault).
func writeBody(w io.Writer, prefix net.Buffers, b *outBody) error {
	sideWritten.Add(b.wireLen())
	bufs := prefix
	if b.z != nil {
		bufs = append(bufs, *b.z)
		_, err := bufs.WriteTo(w)
		return err
	}
	flush := func() error {
		if len(bufs) == 0 {
			return nil
		}
		_, err := bufs.WriteTo(w)
		bufs = nil
		return err
	}
	for _, p := range b.parts {
		if p.t.Mapped() {
			if err := flush(); err != nil {
				return err
			}
			if _, err := p.t.GatherTo(w, p.rows); err != nil {
				return err
			}
			continue
		}
		data, err := p.t.Bytes()
		if err != nil {
			return err
		}
		if p.rows == nil {
			bufs = append(bufs, data)
			continue
		}
		rb := p.t.RowBytes()
		for _, r := range p.rows {
			bufs = append(bufs, data[r*rb:(r+1)*rb])
		}
	}
	return flush()
}
