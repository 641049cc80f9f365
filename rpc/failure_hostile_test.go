package rpc

// Failure tests (failure_test.go): peers that send garbage or stop short,
// and what the server leaves behind (goroutines, a Close during handshakes).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

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
