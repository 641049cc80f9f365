package rpc

// Failure and bad-input tests: wrong tokens and certificates, references
// that leave the root, arguments that do not fit their files, callers that
// give up, and peers that send garbage. Each checks that the server refuses
// cleanly, changes nothing it should not, and goes on serving others.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/tensorwire/tensorwire/internal/testcert"
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

// ---- authentication ----

func TestServer_WrongToken(t *testing.T) {
	for _, tc := range []struct {
		name           string
		server, client string
		ok             bool
	}{
		{"no token either side", "", "", true},
		{"same token", "s3cret", "s3cret", true},
		{"wrong token", "s3cret", "guess", false},
		{"client without token", "s3cret", "", false},
		{"client with token, server without", "", "s3cret", false},
		{"token differs by a byte", "s3cret", "s3creT", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTestNode(t, tokenOpt(tc.server)...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := Dial(ctx, n.addr, tokenOpt(tc.client)...)
			if tc.ok {
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				defer c.Close()
				if _, err := Call[echoMsg](ctx, c, methodRecord, echoMsg{}); err != nil {
					t.Fatal(err)
				}
				if got := n.calls.Load(); got != 1 {
					t.Fatalf("handler ran %d times, want 1", got)
				}
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("Dial: %v, want Unauthenticated", err)
			}
			if tc.server != "" {
				// A peer that skips the proof and goes straight to a call
				// gets nowhere either.
				rawSkipAuth(t, n.addr, methodRecord)
			}
			if got := n.calls.Load(); got != 0 {
				t.Fatalf("a handler ran %d times for an unauthenticated peer", got)
			}
		})
	}
}

func tokenOpt(tok string) []Option {
	if tok == "" {
		return nil
	}
	return []Option{WithToken([]byte(tok))}
}

// rawSkipAuth sends a hello without a token, ignores the verdict, and sends
// a call as if yamux had started: the server must close the connection
// without running anything.
func rawSkipAuth(t *testing.T, addr, method string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	must(t, err)
	defer conn.Close()
	h, err := newHello(FSID{}, nil)
	must(t, err)
	args, err := encodeMsgpack(echoMsg{})
	must(t, err)
	var req bytes.Buffer
	bw := bufio.NewWriter(&req)
	must(t, writeFrame(bw, &requestHeader{Method: method, ArgLen: int64(len(args))}, args))
	must(t, bw.Flush())
	// A yamux SYN data frame for stream 1 carrying the call, so that a server
	// that skipped its checks would run it.
	frame := make([]byte, 12)                // version 0, type 0 (data)
	binary.BigEndian.PutUint16(frame[2:], 1) // flags: SYN
	binary.BigEndian.PutUint32(frame[4:], 1) // stream 1
	binary.BigEndian.PutUint32(frame[8:], uint32(req.Len()))
	out := append(h.marshal(), make([]byte, proofSize)...) // a proof of zeros
	out = append(out, frame...)
	out = append(out, req.Bytes()...)
	conn.Write(out)
	expectClosed(t, conn, 30*time.Second)
}

// expectClosed reads conn until it fails and checks it failed because the
// peer closed it, within d.
func expectClosed(t *testing.T, conn net.Conn, d time.Duration) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", d)
	}
}

// ---- TLS ----

func TestServer_TLS(t *testing.T) {
	cert, pool := testcert.New(t)
	_, otherPool := testcert.New(t)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	for _, tc := range []struct {
		name           string
		clientTLS      *tls.Config // nil: plain TCP
		server, client string      // tokens
		wantCode       Code        // OK: the call succeeds
	}{
		{"trusted, no token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "", "", OK},
		{"trusted, token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "tok", "tok", OK},
		{"trusted, no ServerName", &tls.Config{RootCAs: pool}, "tok", "tok", OK},
		{"trusted, wrong token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "tok", "bad", Unauthenticated},
		{"trusted, no client token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "tok", "", Unauthenticated},
		{"untrusted certificate", &tls.Config{RootCAs: otherPool, ServerName: "127.0.0.1"}, "", "", Unauthenticated},
		{"untrusted certificate, token", &tls.Config{RootCAs: otherPool, ServerName: "127.0.0.1"}, "tok", "tok", Unauthenticated},
		{"wrong name", &tls.Config{RootCAs: pool, ServerName: "example.com"}, "", "", Unauthenticated},
		{"plain client", nil, "", "", Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTestNode(t, append(tokenOpt(tc.server), WithTLS(serverTLS))...)
			opts := tokenOpt(tc.client)
			if tc.clientTLS != nil {
				opts = append(opts, WithTLS(tc.clientTLS))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := Dial(ctx, n.addr, opts...)
			if err == nil {
				defer c.Close()
				_, err = Call[echoMsg](ctx, c, methodRecord, echoMsg{})
			}
			if tc.wantCode == OK {
				if err != nil {
					t.Fatal(err)
				}
				if n.calls.Load() != 1 {
					t.Fatalf("handler ran %d times, want 1", n.calls.Load())
				}
				return
			}
			if CodeOf(err) != tc.wantCode {
				t.Fatalf("err = %v, want code %v", err, tc.wantCode)
			}
			if n.calls.Load() != 0 {
				t.Fatalf("handler ran %d times for a refused peer", n.calls.Load())
			}
		})
	}
	t.Run("TLS client, plain server", func(t *testing.T) {
		n := startTestNode(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := Dial(ctx, n.addr, WithTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}))
		if err == nil {
			c.Close()
			t.Fatal("Dial succeeded")
		}
	})
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

// newRawPeer connects to addr, runs the handshake and starts yamux.
func newRawPeer(addr string, token []byte) (*rawPeer, error) {
	return newRawPeerVersion(addr, token, ProtocolVersion)
}

// newRawPeerVersion is newRawPeer offering protocol version v.
func newRawPeerVersion(addr string, token []byte, v uint8) (*rawPeer, error) {
	conn, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := clientHandshakeVersion(conn, v, rootSide{}, token); err != nil {
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

// ---- references ----

// refTD is a by-reference wire TD of one tensor.
func refTD(path, dtype string, file, shape []int, off int64, batch, rows []int) *wireTD {
	return &wireTD{
		Batch: batch,
		Rows:  rows,
		Entries: []wireEntry{{
			Key: []string{"memmap"}, Kind: kindTensor, DType: dtype, Shape: shape,
			Ref: &wireRef{Path: path, File: file, Offset: off},
		}},
	}
}

// fillByRef sends a fill of value 7 through a raw peer.
func fillByRef(t *testing.T, p *rawPeer, w *wireTD) responseHeader {
	t.Helper()
	return p.rawCall(t, MethodFill, &FillRequest{TD: TD{wire: w}, Value: 7}, nil)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return b
}

func TestServer_RefOutsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	n := startTestNode(t, WithRoot(root))
	shape := []int{10, 4, 4, 3}

	// A file outside the root, shaped like the seed leaf, and the ways to
	// reach it from inside.
	victim := filepath.Join(outside, "memmap.memmap")
	must(t, os.WriteFile(victim, make([]byte, 480), 0o644))
	must(t, os.Symlink(victim, filepath.Join(root, "out.memmap")))
	must(t, os.Symlink(outside, filepath.Join(root, "outdir")))
	must(t, os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	must(t, os.Symlink("../../../"+filepath.Base(outside)+"/memmap.memmap", filepath.Join(root, "a", "b", "rel.memmap")))
	// A link inside the root to a file inside it, which must work.
	td := seedTD(t, filepath.Join(root, "td"), 10)
	must(t, os.Symlink(filepath.Join("td", "memmap.memmap"), filepath.Join(root, "in.memmap")))
	must(t, os.Symlink(filepath.Join("..", "..", "td", "memmap.memmap"), filepath.Join(root, "a", "b", "in.memmap")))
	// The root's identity, which nothing may write through a reference.
	fsidPath := filepath.Join(root, FSIDFile)
	must(t, os.Symlink(FSIDFile, filepath.Join(root, "fsid.memmap")))
	must(t, os.Link(fsidPath, filepath.Join(root, "fsid-hard.memmap")))
	fsidBefore := readFile(t, fsidPath)
	p := dialRaw(t, n.addr, nil)

	for _, tc := range []struct {
		name, path string
		want       Code
		shape      []int // of the file and the view; nil: the seed's
	}{
		{"dot-dot", "../" + filepath.Base(outside) + "/memmap.memmap", PermissionDenied, nil},
		{"dot-dot inside", "td/../../" + filepath.Base(outside) + "/memmap.memmap", PermissionDenied, nil},
		{"absolute", victim, PermissionDenied, nil},
		{"absolute inside the root", filepath.Join(root, "td", "memmap.memmap"), PermissionDenied, nil},
		{"empty", "", PermissionDenied, nil},
		{"backslash", `td\..\..\x`, PermissionDenied, nil},
		{"symlink to a file outside", "out.memmap", PermissionDenied, nil},
		{"symlink to a folder outside", "outdir/memmap.memmap", PermissionDenied, nil},
		{"relative symlink climbing out", "a/b/rel.memmap", PermissionDenied, nil},
		{"the root's identity file", FSIDFile, PermissionDenied, []int{32}},
		{"a link to the root's identity file", "fsid.memmap", PermissionDenied, []int{32}},
		{"a hard link to the root's identity file", "fsid-hard.memmap", PermissionDenied, []int{32}},
		{"missing file", "td/nothing.memmap", NotFound, nil},
		{"the file itself", "td/memmap.memmap", OK, nil},
		{"symlink inside the root", "in.memmap", OK, nil},
		{"relative symlink inside the root", "a/b/in.memmap", OK, nil},
		{"dot-dot that stays inside", "a/../td/memmap.memmap", OK, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := shape
			if tc.shape != nil {
				sh = tc.shape
			}
			rh := fillByRef(t, p, refTD(tc.path, "uint8", sh, sh, 0, sh[:1], []int{3}))
			if Code(rh.Code) != tc.want {
				t.Fatalf("fill through %q: %v %q, want %v", tc.path, Code(rh.Code), rh.Message, tc.want)
			}
			if b := readFile(t, victim); !bytes.Equal(b, make([]byte, 480)) {
				t.Fatal("the file outside the root was written")
			}
			if !bytes.Equal(readFile(t, fsidPath), fsidBefore) {
				t.Fatal("the root's identity file was written")
			}
		})
	}
	// The fills that were allowed wrote row 3 of the file inside.
	if got := rowsSet(t, td, 7); !equalInts(got, []int{3}) {
		t.Fatalf("rows of sevens inside the root: %v, want [3]", got)
	}
	echo(t, dial(t, n.addr))
}

// TestServer_ReadOutsideRoot checks the prefixes of the read and describe
// services the same way.
func TestServer_ReadOutsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	n := startTestNode(t, WithRoot(root))
	seedTD(t, filepath.Join(outside, "td"), 4)
	seedTD(t, filepath.Join(root, "td"), 4)
	must(t, os.Symlink(filepath.Join(outside, "td"), filepath.Join(root, "outlink")))
	must(t, os.MkdirAll(filepath.Join(root, "leafout"), 0o755))
	must(t, os.Symlink(filepath.Join(outside, "td", "memmap.memmap"), filepath.Join(root, "leafout", "memmap.memmap")))
	must(t, os.Link(filepath.Join(root, "td", "meta.json"), filepath.Join(root, "leafout", "meta.json")))
	c := dial(t, n.addr)
	ctx := context.Background()
	for _, tc := range []struct {
		prefix string
		want   Code
	}{
		{"../" + filepath.Base(outside) + "/td", PermissionDenied},
		{filepath.Join(outside, "td"), PermissionDenied},
		{"outlink", PermissionDenied},
		{"leafout", PermissionDenied},
		{"nothing", NotFound},
		{"td", OK},
	} {
		_, err := c.Read(ctx, tc.prefix, nil)
		if CodeOf(err) != tc.want {
			t.Errorf("Read(%q): %v, want %v", tc.prefix, err, tc.want)
		}
		_, err = c.Describe(ctx, tc.prefix)
		if CodeOf(err) != tc.want {
			t.Errorf("Describe(%q): %v, want %v", tc.prefix, err, tc.want)
		}
	}
}

func TestServer_BadReference(t *testing.T) {
	root := t.TempDir()
	n := startTestNode(t, WithRoot(root))
	td := seedTD(t, filepath.Join(root, "td"), 10)
	file := filepath.Join(root, "td", "memmap.memmap")
	must(t, td.Fill([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 5))
	before := readFile(t, file)
	p := dialRaw(t, n.addr, nil)
	shape := []int{10, 4, 4, 3}
	const path = "td/memmap.memmap"
	for _, tc := range []struct {
		name string
		w    *wireTD
		want Code
	}{
		{"row past the end", refTD(path, "uint8", shape, shape, 0, []int{10}, []int{0, 10}), InvalidArgument},
		{"negative row", refTD(path, "uint8", shape, shape, 0, []int{10}, []int{-1}), InvalidArgument},
		{"huge row", refTD(path, "uint8", shape, shape, 0, []int{10}, []int{1 << 62}), InvalidArgument},
		{"file shape larger than the file", refTD(path, "uint8", []int{20, 4, 4, 3}, []int{20, 4, 4, 3}, 0, []int{20}, []int{15}), InvalidArgument},
		{"view larger than the file shape", refTD(path, "uint8", shape, []int{20, 4, 4, 3}, 0, []int{20}, []int{0}), InvalidArgument},
		{"view past the end", refTD(path, "uint8", shape, shape, 48, []int{10}, []int{0}), InvalidArgument},
		{"negative offset", refTD(path, "uint8", shape, shape, -48, []int{10}, []int{0}), InvalidArgument},
		{"wrong dtype for the file", refTD(path, "float32", shape, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"misaligned offset", refTD(path, "int16", []int{240}, []int{2, 3}, 1, []int{2}, []int{0}), InvalidArgument},
		{"unknown dtype", refTD(path, "float7", shape, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"negative dimension", refTD(path, "uint8", []int{-10, 4, 4, 3}, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"overflowing file shape", refTD(path, "uint8", []int{1 << 40, 1 << 40}, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"batch not matching the tensor", refTD(path, "uint8", shape, shape, 0, []int{20}, []int{0}), InvalidArgument},
		{"directory", refTD("td", "uint8", shape, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"unknown entry kind", &wireTD{Batch: []int{10}, Entries: []wireEntry{{Key: []string{"x"}, Kind: "blob"}}}, InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh := fillByRef(t, p, tc.w)
			if Code(rh.Code) != tc.want {
				t.Fatalf("fill: %v %q, want %v", Code(rh.Code), rh.Message, tc.want)
			}
			if !bytes.Equal(readFile(t, file), before) {
				t.Fatal("a refused fill changed the file")
			}
		})
	}
	// The client checks rows itself, before sending anything.
	c := dial(t, n.addr, WithRoot(root))
	if err := c.Fill(context.Background(), td, []int{10}, 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Fill row 10 of 10: %v, want InvalidArgument", err)
	}
	if !bytes.Equal(readFile(t, file), before) {
		t.Fatal("a refused fill changed the file")
	}
	echo(t, c)
}

// TestServer_BadBytesTD sends TensorDicts by bytes whose wire form does not
// fit the body or itself.
func TestServer_BadBytesTD(t *testing.T) {
	n := startTestNode(t)
	p := dialRaw(t, n.addr, nil)
	tensor := func(shape ...int) wireEntry {
		return wireEntry{Key: []string{"x"}, Kind: kindTensor, DType: "uint8", Shape: shape}
	}
	for _, tc := range []struct {
		name string
		w    *wireTD
		body int
		ok   bool // nothing to fill: success is right too
	}{
		{"body too short", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(4, 2)}}, 7, false},
		{"body too long", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(4, 2)}}, 9, false},
		{"negative shape", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(-4, 2)}}, 0, false},
		{"overflowing shape", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(1<<62, 1<<62)}}, 0, false},
		{"gathered without a batch", &wireTD{Gathered: true}, 0, false},
		{"gathered, huge batch", &wireTD{Gathered: true, Batch: []int{1 << 60}}, 0, false},
		{"gathered, huge batch of empty rows", &wireTD{Gathered: true, Batch: []int{1 << 40}, Entries: []wireEntry{tensor(1<<40, 0)}}, 0, false},
		{"huge batch", &wireTD{Batch: []int{1 << 60}}, 0, true},
		{"huge batch of empty rows", &wireTD{Batch: []int{1 << 40}, Entries: []wireEntry{tensor(1<<40, 0)}}, 0, true},
		{"negative batch", &wireTD{Batch: []int{-1}}, 0, false},
		{"bad key", &wireTD{Batch: []int{4}, Entries: []wireEntry{{Kind: kindTensor, DType: "uint8", Shape: []int{4}}}}, 4, false},
		{"bad non-tensor data", &wireTD{Batch: []int{4}, Entries: []wireEntry{{Key: []string{"d"}, Kind: kindData, Data: []byte("{")}}}, 0, false},
		{"tensor under a non-dict", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(4), {Key: []string{"x", "y"}, Kind: kindTensor, DType: "uint8", Shape: []int{4}}}}, 8, false},
		{"a reference to a node without root", refTD("td/memmap.memmap", "uint8", []int{4}, []int{4}, 0, []int{4}, nil), 0, false},
		{"sizes that add up past 2^63", &wireTD{Batch: []int{1 << 62}, Entries: []wireEntry{
			{Key: []string{"a"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
			{Key: []string{"b"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
			{Key: []string{"c"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
			{Key: []string{"d"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
		}}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh := p.rawCall(t, MethodFill, &FillRequest{TD: TD{wire: tc.w}, Value: 1}, make([]byte, tc.body))
			switch c := Code(rh.Code); {
			case c == OK && !tc.ok, c == Internal, c == Unknown:
				t.Fatalf("fill: %v %q, want a refusal", c, rh.Message)
			}
		})
	}
	echo(t, dial(t, n.addr))
}

// TestClient_BadResultTDs gives the client responses whose TensorDicts do
// not fit the body: refused as Internal before anything is allocated for
// their tensors, as the node refuses such requests.
func TestClient_BadResultTDs(t *testing.T) {
	tensor := func(key string, shape ...int) wireEntry {
		return wireEntry{Key: []string{key}, Kind: kindTensor, DType: "uint8", Shape: shape}
	}
	for _, tc := range []struct {
		name string
		w    *wireTD
		body int
	}{
		{"64 MiB claimed, none sent", &wireTD{Batch: []int{64 << 20}, Entries: []wireEntry{tensor("x", 64<<20)}}, 0},
		{"body too long", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor("x", 4)}}, 5},
		{"sizes that add up past 2^63", &wireTD{Batch: []int{1 << 62}, Entries: []wireEntry{
			tensor("a", 1<<62), tensor("b", 1<<62), tensor("c", 1<<62), tensor("d", 1<<62)}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &bodyReader{r: bytes.NewReader(make([]byte, tc.body)), n: int64(tc.body)}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := readResultTDs(body, nil, []*TD{{wire: tc.w}})
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrInternal) {
				t.Fatalf("readResultTDs: %v, want Internal", err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Fatalf("%d bytes allocated for a refused response", n)
			}
		})
	}
}

// ---- deadlines and cancellation ----

func TestCall_CallerGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline bool
		want     []error
	}{
		{"deadline", true, []error{ErrDeadlineExceeded, context.DeadlineExceeded}},
		{"cancel", false, []error{ErrCanceled, context.Canceled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTestNode(t)
			c := dial(t, n.addr)
			echo(t, c) // a pooled stream, so the call below reuses it
			var ctx context.Context
			var cancel context.CancelFunc
			if tc.deadline {
				ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
			} else {
				ctx, cancel = context.WithCancel(context.Background())
				go func() {
					<-n.started
					time.Sleep(50 * time.Millisecond)
					cancel()
				}()
			}
			defer cancel()
			start := time.Now()
			_, err := Call[echoMsg](ctx, c, methodBlock, echoMsg{})
			if took := time.Since(start); took > 30*time.Second {
				t.Fatalf("the call took %v to give up", took)
			}
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want it to match %v", err, want)
				}
			}
			select {
			case herr := <-n.ended:
				if herr == nil {
					t.Fatal("the handler's context did not end")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the handler did not see its context end within 30 s")
			}
			echo(t, c)
		})
	}
	t.Run("deadline centuries away", func(t *testing.T) {
		// The largest timeout_us a client sends (time.Until saturates at
		// 292 years) must not overflow into a deadline in the past.
		n := startTestNode(t)
		c := dial(t, n.addr)
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().AddDate(1000, 0, 0))
		defer cancel()
		if _, err := Call[echoMsg](ctx, c, methodRecord, echoMsg{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("already expired", func(t *testing.T) {
		n := startTestNode(t)
		c := dial(t, n.addr)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := Call[echoMsg](ctx, c, methodRecord, echoMsg{}); !errors.Is(err, ErrCanceled) {
			t.Fatalf("err = %v, want Canceled", err)
		}
		if n.calls.Load() != 0 {
			t.Fatal("a cancelled call ran")
		}
		echo(t, c)
	})
}

// ---- limits ----

func TestServer_StreamLimit(t *testing.T) {
	l := hostileLimits()
	l.MaxStreamsPerPeer = 2
	n := startTestNode(t, WithLimits(l))
	c := dial(t, n.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f1 := Go[echoMsg](ctx, c, methodBlock, echoMsg{N: 1})
	f2 := Go[echoMsg](ctx, c, methodBlock, echoMsg{N: 2})
	<-n.started
	<-n.started
	// Two calls in flight: a third is refused, again and again.
	for i := range 3 {
		if _, err := Call[echoMsg](ctx, c, methodEcho, echoMsg{}); !errors.Is(err, ErrResourceExhausted) {
			t.Fatalf("call %d over the limit: %v, want ResourceExhausted", i, err)
		}
	}
	// Other peers are not limited by this one.
	echo(t, dial(t, n.addr))
	close(n.release)
	for _, f := range []*Future[echoMsg]{f1, f2} {
		if _, err := f.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		echo(t, c)
	}
	// Two at a time fit.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { echo(t, c) })
	}
	wg.Wait()
}

// TestServer_GatherOverLimit asks the built-in services to gather more row
// bytes than MaxBodyBytes, by repeating rows in a small request: refused
// before the memory is taken.
func TestServer_GatherOverLimit(t *testing.T) {
	root := t.TempDir()
	l := hostileLimits()
	l.MaxBodyBytes = 64 << 10
	n := startTestNode(t, WithRoot(root), WithLimits(l))
	seedTD(t, filepath.Join(root, "td"), 10) // rows of 48 bytes
	file := filepath.Join(root, "td", "memmap.memmap")
	before := readFile(t, file)
	c := dial(t, n.addr)
	ctx := context.Background()
	many := make([]int, 2000) // 96 000 bytes of row 0
	if _, err := c.Read(ctx, "td", many); !errors.Is(err, ErrResourceExhausted) {
		t.Fatalf("Read of %d rows: %v, want ResourceExhausted", len(many), err)
	}
	if _, err := c.Read(ctx, "td", many[:1000]); err != nil {
		t.Fatalf("Read of 1000 rows: %v", err)
	}
	p := dialRaw(t, n.addr, nil)
	shape := []int{10, 4, 4, 3}
	dst := refTD("td/memmap.memmap", "uint8", shape, shape, 0, []int{10}, many)
	src := refTD("td/memmap.memmap", "uint8", shape, shape, 0, []int{10}, many)
	rh := p.rawCall(t, MethodFill, &FillRequest{TD: TD{wire: dst}, Src: &TD{wire: src}}, nil)
	if Code(rh.Code) != ResourceExhausted {
		t.Fatalf("fill from %d gathered rows: %v %q, want ResourceExhausted", len(many), Code(rh.Code), rh.Message)
	}
	if !bytes.Equal(readFile(t, file), before) {
		t.Fatal("a refused fill changed the file")
	}
}

// TestServer_IdleStreamsOverLimit checks that streams over the limit that
// send nothing are closed after TransferGrace, not IdleTimeout, so a peer
// cannot hold any number of them open.
func TestServer_IdleStreamsOverLimit(t *testing.T) {
	l := hostileLimits()
	l.MaxStreamsPerPeer = 2
	l.IdleTimeout = time.Minute
	n := startTestNode(t, WithLimits(l))
	p := dialRaw(t, n.addr, nil)
	const streams = 6
	results := make(chan error, streams)
	for range streams {
		st := p.stream(t)
		defer st.Close()
		go func() {
			st.SetReadDeadline(time.Now().Add(l.TransferGrace + 5*time.Second))
			_, err := st.Read(make([]byte, 1))
			results <- err
		}()
	}
	var closed, open int
	for range streams {
		switch err := <-results; {
		case err == io.EOF, errors.Is(err, yamux.ErrConnectionReset): // reset: over yamux's accept backlog
			closed++
		case errors.Is(err, yamux.ErrTimeout):
			open++
		default:
			t.Fatalf("read: %v", err)
		}
	}
	if closed != streams-l.MaxStreamsPerPeer || open != l.MaxStreamsPerPeer {
		t.Fatalf("%d streams closed by the server and %d open, want %d and %d", closed, open, streams-l.MaxStreamsPerPeer, l.MaxStreamsPerPeer)
	}
	echo(t, dial(t, n.addr))
}

// TestClient_StreamIdledOut checks that streams the server closed while
// they sat in the client's pool are not used for calls.
func TestClient_StreamIdledOut(t *testing.T) {
	l := hostileLimits()
	l.IdleTimeout = 200 * time.Millisecond
	n := startTestNode(t, WithLimits(l))
	c := dial(t, n.addr)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { echo(t, c) })
	}
	wg.Wait()
	time.Sleep(aliveCheckAfter + 2*l.IdleTimeout)
	for range 4 {
		echo(t, c)
	}
	for range 4 {
		wg.Go(func() { echo(t, c) })
	}
	wg.Wait()
}

// ---- garbage ----

// hostileCase is something a bad peer does to a server.
type hostileCase struct {
	name string
	// do misbehaves against addr and checks that the server closed the
	// connection.
	do func(t *testing.T, addr string)
}

// framed returns a length prefix of n followed by b.
func framed(n uint32, b []byte) []byte {
	out := binary.BigEndian.AppendUint32(nil, n)
	return append(out, b...)
}

func frameHdr(t *testing.T, h any) []byte {
	b, err := encodeMsgpack(h)
	must(t, err)
	return framed(uint32(len(b)), b)
}

func hostileCases() []hostileCase {
	// beforeHandshake writes b on a new TCP connection.
	beforeHandshake := func(b func() []byte) func(t *testing.T, addr string) {
		return func(t *testing.T, addr string) {
			conn, err := net.Dial("tcp", addr)
			must(t, err)
			defer conn.Close()
			conn.Write(b())
			expectClosed(t, conn, 30*time.Second)
		}
	}
	// afterHandshake writes b on a connection that passed the handshake, in
	// place of yamux frames.
	afterHandshake := func(b []byte) func(t *testing.T, addr string) {
		return func(t *testing.T, addr string) {
			conn, err := net.Dial("tcp", addr)
			must(t, err)
			defer conn.Close()
			if _, err := clientHandshake(conn, rootSide{}, nil); err != nil {
				t.Fatal(err)
			}
			conn.Write(b)
			expectClosed(t, conn, 30*time.Second)
		}
	}
	// onStream writes what b returns on a yamux stream.
	onStream := func(b func(t *testing.T) []byte) func(t *testing.T, addr string) {
		return func(t *testing.T, addr string) {
			p := dialRaw(t, addr, nil)
			st := p.stream(t)
			st.Write(b(t))
			p.expectSessionClosed(t, 30*time.Second)
		}
	}
	random := func(n int) func() []byte {
		return func() []byte {
			b := make([]byte, n)
			rand.Read(b)
			return b
		}
	}
	validHello := func() []byte {
		h, _ := newHello(FSID{}, nil)
		return h.marshal()
	}
	return []hostileCase{
		{"random bytes instead of a hello", beforeHandshake(random(64))},
		{"a long random stream", beforeHandshake(random(1 << 20))},
		{"half a hello, then silence", beforeHandshake(func() []byte { return validHello()[:30] })},
		{"nothing at all", beforeHandshake(func() []byte { return nil })},
		{"HTTP", beforeHandshake(func() []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat(" ", 40)) })},
		{"hello with reserved bits", beforeHandshake(func() []byte { b := validHello(); b[60] = 1; return b })},
		{"hello of another version", beforeHandshake(func() []byte { b := validHello(); b[4] = 99; return b })},
		{"hello with a token flag, no proof", beforeHandshake(func() []byte { b := validHello(); b[5] = 1; return b })},
		{"random bytes after the handshake", afterHandshake(bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 1000))},
		{"a yamux frame of another version", afterHandshake([]byte{7, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 4, 1, 2, 3, 4})},
		{"a header claiming 4 GB", onStream(func(*testing.T) []byte { return []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3} })},
		{"a header of 0 bytes", onStream(func(*testing.T) []byte { return []byte{0, 0, 0, 0} })},
		{"a header over the limit", onStream(func(*testing.T) []byte { return framed(64<<10+1, nil) })},
		{"random bytes on a stream", onStream(func(*testing.T) []byte { b := random(4096)(); b[0], b[1] = 0, 0xff; return b })},
		{"a header that is not msgpack", onStream(func(*testing.T) []byte { return framed(5, []byte{0xc1, 0xc1, 0xc1, 0xc1, 0xc1}) })},
		{"a header with bytes after it", onStream(func(t *testing.T) []byte {
			h := frameHdr(t, &requestHeader{Method: methodRecord})
			binary.BigEndian.PutUint32(h, binary.BigEndian.Uint32(h)+1)
			return append(h, 0xc0)
		})},
		{"a header of the wrong type", onStream(func(t *testing.T) []byte { return frameHdr(t, []int{1, 2, 3}) })},
		{"body_len of 4 GiB and more", onStream(func(t *testing.T) []byte {
			return frameHdr(t, &requestHeader{Method: methodRecord, BodyLen: 4<<30 + 1})
		})},
		{"body_len of 2^62", onStream(func(t *testing.T) []byte {
			return frameHdr(t, &requestHeader{Method: methodRecord, BodyLen: 1 << 62})
		})},
		{"negative body_len", onStream(func(t *testing.T) []byte {
			return frameHdr(t, &requestHeader{Method: methodRecord, BodyLen: -1})
		})},
		{"huge arg_len", onStream(func(t *testing.T) []byte {
			return frameHdr(t, &requestHeader{Method: methodRecord, ArgLen: 1 << 40})
		})},
		{"negative arg_len", onStream(func(t *testing.T) []byte {
			return frameHdr(t, &requestHeader{Method: methodRecord, ArgLen: -5})
		})},
	}
}

func TestServer_Garbage(t *testing.T) {
	n := startTestNode(t)
	before := dial(t, n.addr)
	echo(t, before)
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			tc.do(t, n.addr)
			if got := n.calls.Load(); got != 0 {
				t.Fatalf("a handler ran %d times", got)
			}
			echo(t, before)
			echo(t, dial(t, n.addr))
		})
	}
}

// TestServer_TruncatedCall sends calls that stop short: the handler must
// not run, and the server must neither hang nor keep the stream.
func TestServer_TruncatedCall(t *testing.T) {
	n := startTestNode(t)
	args, err := encodeMsgpack(echoMsg{N: 1})
	must(t, err)
	for _, tc := range []struct {
		name  string
		hdr   requestHeader
		bytes []byte // written after the header
		close bool   // then close the stream (else leave it open)
	}{
		{"body cut short", requestHeader{Method: methodRecord, ArgLen: int64(len(args)), BodyLen: 1000}, append(args, make([]byte, 10)...), true},
		{"arguments cut short", requestHeader{Method: methodRecord, ArgLen: 1000}, args, true},
		{"header cut short", requestHeader{}, nil, true},
		{"body cut short, stream left open", requestHeader{Method: methodRecord, ArgLen: int64(len(args)), BodyLen: 1000}, append(args, make([]byte, 10)...), false},
		{"arguments cut short, stream left open", requestHeader{Method: methodRecord, ArgLen: 1000}, args, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dialRaw(t, n.addr, nil)
			st := p.stream(t)
			h := frameHdr(t, &tc.hdr)
			if tc.hdr.Method == "" {
				h = h[:len(h)-3] // cut inside the header itself
			}
			st.Write(append(h, tc.bytes...))
			if tc.close {
				st.Close()
			}
			// The server ends the stream: at once when it was closed, after
			// its deadline for the rest of the request (TransferGrace plus
			// the bytes at MinTransferRate) when it was left open.
			st.SetReadDeadline(time.Now().Add(30 * time.Second))
			b, err := io.ReadAll(st)
			if err != nil || len(b) != 0 {
				t.Fatalf("read %d bytes, %v; want the stream closed with no response", len(b), err)
			}
			if got := n.calls.Load(); got != 0 {
				t.Fatalf("the handler ran %d times", got)
			}
			echo(t, dial(t, n.addr))
		})
	}
}

// ---- leaks and shutdown ----

// TestServer_NoGoroutineLeak runs the hostile cases and the calls that give
// up against one server and checks that its goroutines go back to where
// they were once the peers have gone.
func TestServer_NoGoroutineLeak(t *testing.T) {
	l := hostileLimits()
	l.MaxStreamsPerPeer = 2
	n := startTestNode(t, WithLimits(l))
	echo(t, dial(t, n.addr)) // warm up whatever starts once
	base := runtime.NumGoroutine()

	for _, tc := range hostileCases() {
		tc.do(t, n.addr)
	}
	c, err := Dial(context.Background(), n.addr)
	must(t, err)
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		Call[echoMsg](ctx, c, methodBlock, echoMsg{})
		cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	f1 := Go[echoMsg](ctx, c, methodBlock, echoMsg{})
	f2 := Go[echoMsg](ctx, c, methodBlock, echoMsg{})
	<-n.started
	<-n.started
	Call[echoMsg](context.Background(), c, methodEcho, echoMsg{}) // over the limit
	cancel()
	f1.Wait()
	f2.Wait()
	p := dialRaw(t, n.addr, nil)
	st := p.stream(t)
	st.Write(frameHdr(t, &requestHeader{Method: methodRecord, BodyLen: 1000})) // then nothing
	p.sess.Close()
	c.Close()
	waitGoroutines(t, base, 3)
}

// waitGoroutines waits up to 30 s for the goroutine count to fall to
// base+slack, and fails with every goroutine's stack if it does not.
func waitGoroutines(t *testing.T, base, slack int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base+slack {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines, %d before the hostile peers:\n%s", n, base, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServer_CloseDuringHandshake checks that Close does not wait for peers
// stuck in the handshake, nor for handlers' streams.
func TestServer_CloseDuringHandshake(t *testing.T) {
	l := DefaultLimits() // a 10 s handshake timeout
	s, err := NewServer(WithLimits(l))
	must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	base := runtime.NumGoroutine()
	var conns []net.Conn
	for _, b := range [][]byte{nil, []byte("TWRP")} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		must(t, err)
		defer conn.Close()
		conn.Write(b)
		conns = append(conns, conn)
	}
	c, err := Dial(context.Background(), ln.Addr().String())
	must(t, err)
	defer c.Close()
	if _, err := c.Describe(context.Background(), "x"); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("Describe on a node without a root: %v", err)
	}
	// Both connections are in the handshake before Close.
	for deadline := time.Now().Add(30 * time.Second); s.Stats().Handshakes != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("handshakes in progress: %d, want 2", s.Stats().Handshakes)
		}
	}
	start := time.Now()
	must(t, s.Close())
	if took := time.Since(start); took > l.HandshakeTimeout/2 {
		t.Fatalf("Close took %v: it waits for the handshake timeout (%v)", took, l.HandshakeTimeout)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	for _, conn := range conns {
		expectClosed(t, conn, l.HandshakeTimeout/2) // closed by Close, not by the timeout
	}
	if _, err := c.Describe(context.Background(), "x"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a call to a closed server: %v, want Unavailable", err)
	}
	waitGoroutines(t, base, 3)
}

// An error message that quotes what a peer sent is cut short, so the
// refusal reaches the caller instead of breaking its connection: a method
// name of control bytes quoted in "no method %q" grows fourfold, past the
// client's 64 KiB header limit.
func TestServer_LongErrorMessage(t *testing.T) {
	n := startTestNode(t, WithLimits(DefaultLimits()))
	c := dial(t, n.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Call[echoMsg](ctx, c, strings.Repeat("\x01", 20000), echoMsg{})
	if !errors.Is(err, ErrUnimplemented) {
		t.Fatalf("a call of a 20,000-byte unknown method: %v, want Unimplemented", err)
	}
	if len(err.Error()) > 5000 {
		t.Fatalf("the message is %d bytes long", len(err.Error()))
	}
	echo(t, c)
}

// TestServer_StreamsPastTwiceTheLimit opens many streams that send nothing
// on one connection: the server takes twice MaxStreamsPerPeer of them (the
// limit's calls and as many refusals), yamux's accept backlog holds as many
// again, and the rest are reset at once, so a peer cannot make the server
// hold a goroutine and buffers for each of any number of streams.
func TestServer_StreamsPastTwiceTheLimit(t *testing.T) {
	l := hostileLimits()
	l.MaxStreamsPerPeer = 4
	l.TransferGrace, l.IdleTimeout = time.Minute, time.Minute
	n := startTestNode(t, WithLimits(l))
	p := dialRaw(t, n.addr, nil)
	const streams = 100
	var reset atomic.Int32
	for range streams {
		st := p.stream(t)
		t.Cleanup(func() { st.Close() })
		go func() {
			if _, err := st.Read(make([]byte, 1)); errors.Is(err, yamux.ErrConnectionReset) {
				reset.Add(1)
			}
		}()
	}
	want := int32(streams - 3*l.MaxStreamsPerPeer)
	deadline := time.Now().Add(30 * time.Second)
	for reset.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d streams reset, want %d; the server serves %d", reset.Load(), streams, want, n.s.Stats().Streams)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := n.s.Stats().Streams; got > 2*l.MaxStreamsPerPeer {
		t.Fatalf("the server serves %d streams of one peer, want at most %d", got, 2*l.MaxStreamsPerPeer)
	}
	echo(t, dial(t, n.addr))
}
