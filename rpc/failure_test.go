package rpc

// Failure and bad-input tests: wrong tokens and certificates, references
// that leave the root, arguments that do not fit their files, callers that
// give up, and peers that send garbage. Each checks that the server refuses
// cleanly, changes nothing it should not, and goes on serving others.
//
// This file holds what they share: the test node and its methods, and raw
// peers that speak the protocol by hand. The tests, by topic:
// failure_auth_test.go (tokens, TLS), failure_refs_test.go (references
// and TDs that do not fit), failure_limits_test.go (callers that give up,
// limits), failure_hostile_test.go (garbage, leaks, shutdown).

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// Methods the failure tests register.
const (
	methodEcho   = "test.echo"   // returns its argument
	methodRecord = "test.record" // counts its calls
	methodBlock  = "test.block"  // blocks until its context ends or it is released
)

type echoMsg struct {
	N int    `codec:"n"`
	S string `codec:"s"`
}

// testNode is a server with the test methods registered.
type testNode struct {
	s    *Server
	addr string

	calls   atomic.Int32  // test.record and test.block calls that ran
	started chan struct{} // a test.block call started
	ended   chan error    // a test.block call ended, with its context's error
	release chan struct{} // closed to let test.block calls return
}

// hostileLimits are the default limits with short timeouts, so that tests
// of peers that stall finish quickly.
func hostileLimits() Limits {
	l := DefaultLimits()
	l.HandshakeTimeout = time.Second
	l.TransferGrace = time.Second
	l.IdleTimeout = 5 * time.Second
	return l
}

func startTestNode(t *testing.T, opts ...Option) *testNode {
	t.Helper()
	n := &testNode{started: make(chan struct{}, 16), ended: make(chan error, 16), release: make(chan struct{})}
	opts = append([]Option{WithLimits(hostileLimits())}, opts...)
	n.s, n.addr = startServer(t, opts...)
	must(t, Register(n.s, methodEcho, func(ctx context.Context, m echoMsg) (echoMsg, error) { return m, nil }))
	must(t, Register(n.s, methodRecord, func(ctx context.Context, m echoMsg) (echoMsg, error) {
		n.calls.Add(1)
		return m, nil
	}))
	must(t, Register(n.s, methodBlock, func(ctx context.Context, m echoMsg) (echoMsg, error) {
		n.calls.Add(1)
		n.started <- struct{}{}
		select {
		case <-ctx.Done():
			n.ended <- ctx.Err()
			return m, ctx.Err()
		case <-n.release:
			n.ended <- nil
			return m, nil
		}
	}))
	return n
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// echo calls test.echo on c and checks the answer.
func echo(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := Call[echoMsg](ctx, c, methodEcho, echoMsg{N: 42, S: "hi"})
	if err != nil || got != (echoMsg{N: 42, S: "hi"}) {
		t.Fatalf("echo = %+v, %v", got, err)
	}
}

// ---- raw peers ----

// rawPeer is a connection driven by hand: a correct handshake, then a yamux
// session whose streams the test writes as it likes.
type rawPeer struct {
	conn net.Conn
	sess *yamux.Session
}

func dialRaw(t *testing.T, addr string, token []byte) *rawPeer {
	t.Helper()
	p, err := newRawPeer(addr, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.sess.Close(); p.conn.Close() })
	return p
}

// dialRawIn is dialRaw for a peer whose root is root, the node's (its
// references are resolved: the sides share one page cache).
func dialRawIn(t *testing.T, addr, root string) *rawPeer {
	t.Helper()
	dir, id, err := peekRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newRawPeerSide(addr, nil, ProtocolVersion, rootSide{fsid: id, root: dir, host: localHostID(dir)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.sess.Close(); p.conn.Close() })
	return p
}

// newRawPeer connects to addr, runs the handshake and starts yamux.
func newRawPeer(addr string, token []byte) (*rawPeer, error) {
	return newRawPeerVersion(addr, token, ProtocolVersion)
}

// newRawPeerVersion is newRawPeer offering protocol version v.
func newRawPeerVersion(addr string, token []byte, v uint8) (*rawPeer, error) {
	return newRawPeerSide(addr, token, v, rootSide{})
}

// newRawPeerSide is newRawPeerVersion with this side's root as me says.
func newRawPeerSide(addr string, token []byte, v uint8, me rootSide) (*rawPeer, error) {
	conn, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := clientHandshakeVersion(conn, v, me, token); err != nil {
		conn.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	conn.SetDeadline(time.Time{})
	o := newOptions(nil)
	sess, err := yamux.Client(conn, o.yamuxConfig(true))
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &rawPeer{conn: conn, sess: sess}, nil
}

func (p *rawPeer) stream(t *testing.T) *yamux.Stream {
	t.Helper()
	st, err := p.sess.OpenStream()
	must(t, err)
	return st
}

// expectSessionClosed waits for the server to close p's connection.
func (p *rawPeer) expectSessionClosed(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.sess.CloseChan():
	case <-time.After(d):
		t.Fatalf("the server did not close the connection within %v", d)
	}
}

// rawCall sends one request with hdr's method and the given argument value
// and body bytes on a new stream, and returns the response header.
func (p *rawPeer) rawCall(t *testing.T, method string, arg any, body []byte) responseHeader {
	t.Helper()
	args, err := encodeMsgpack(arg)
	must(t, err)
	st := p.stream(t)
	defer st.Close()
	st.SetDeadline(time.Now().Add(30 * time.Second))
	bw := bufio.NewWriter(st)
	must(t, writeFrame(bw, &requestHeader{Method: method, ArgLen: int64(len(args)), BodyLen: int64(len(body))}, args))
	bw.Write(body)
	must(t, bw.Flush())
	br := bufio.NewReader(st)
	var rh responseHeader
	if err := readHeader(br, 64<<10, &rh); err != nil {
		t.Fatalf("%s: reading the response: %v", method, err)
	}
	io.CopyN(io.Discard, br, rh.ArgLen+rh.BodyLen)
	return rh
}
