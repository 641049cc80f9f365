package rpc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/testcert"
)

// Tests of side connections (side.go): bulk bodies off yamux, and every
// way they can fail without failing more than their call or stream.

// clientConnOf returns c's current connection.
func clientConnOf(t *testing.T, c *Client) *clientConn {
	t.Helper()
	cc, err := c.conn(testCtx(t))
	must(t, err)
	return cc
}

// incCall sends td (its bytes) to test.inctd, which adds 1 to every byte
// and sends them back, and checks they did.
func incCall(t *testing.T, ctx context.Context, c *Client, rows, width int, seed byte) {
	t.Helper()
	td := byteTD(t, rows, width, seed)
	x := firstLeaf(t, td)
	b, _ := x.Bytes()
	want := bytes.Clone(b)
	if _, err := Call[Empty](ctx, c, methodIncTD, sinkReq{X: TD{TensorDict: td, Out: true}}); err != nil {
		t.Fatalf("test.inctd of %d bytes: %v", len(want), err)
	}
	for i := range want {
		if b[i] != want[i]+1 {
			t.Fatalf("byte %d of %d came back as %d, want %d", i, len(want), b[i], want[i]+1)
		}
	}
}

func TestSide_Call(t *testing.T) {
	n := startStreamNode(t)
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	for i := range 3 {
		before := sideWritten.Load()
		incCall(t, ctx, c, 64, 16<<10, byte(i)) // 1 MiB each way
		if moved := sideWritten.Load() - before; moved != 2<<20 {
			t.Fatalf("call %d: %d bytes went on side connections, want the request's and the response's 2 MiB", i, moved)
		}
	}
	// One side connection, reused by the calls one after another.
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections, want 1", got)
	}
	// Compressed bodies go the same way when they are large enough.
	before := sideWritten.Load()
	got, err := Call[genResp](testCtx(t), c, methodGenTD, sinkReq{N: 64, S: "random"})
	must(t, err)
	if x := firstLeaf(t, got.X.TensorDict); x.NumBytes() != 64*4096 {
		t.Fatalf("test.gentd sent %d bytes", x.NumBytes())
	}
	if moved := sideWritten.Load() - before; moved < 64*4096 {
		t.Fatalf("a 256 KiB response: %d bytes went on side connections", moved)
	}
}

// TestSide_TLS: side connections of a TLS session run TLS too, and
// authenticate with the token as the main connection does.
func TestSide_TLS(t *testing.T) {
	cert, pool := testcert.New(t)
	token := []byte("tok")
	n := startStreamNode(t, WithToken(token), WithTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	c := dial(t, n.addr, WithToken(token), WithTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}))
	before := sideWritten.Load()
	for i := range 3 {
		incCall(t, Uncompressed(testCtx(t)), c, 64, 16<<10, byte(i))
	}
	if moved := sideWritten.Load() - before; moved != 3*2<<20 {
		t.Fatalf("%d bytes went on side connections, want 6 MiB", moved)
	}
	// One side connection, reused: what TLS sends after its handshake (1.3's
	// session tickets) does not make the idle check drop it.
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections, want 1", got)
	}
	cc := clientConnOf(t, c)
	cc.side.mu.Lock()
	_, isTLS := cc.side.idle[0].conn.(*tls.Conn)
	dialed := cc.side.nextID
	cc.side.mu.Unlock()
	if dialed != 1 {
		t.Fatalf("the client dialed %d side connections, want 1", dialed)
	}
	if !isTLS {
		t.Fatal("the side connection is not TLS")
	}
}

// TestSide_SmallBodiesInBand: a call whose types hold no TDs takes no side
// connection; a call that holds one (its response may bring a large body)
// sends its whole request there, and gets its whole answer there, whatever
// their sizes.
func TestSide_SmallBodiesInBand(t *testing.T) {
	n := startStreamNode(t)
	c := dial(t, n.addr)
	before := sideWritten.Load()
	incCall(t, Uncompressed(testCtx(t)), c, 10, 10<<10, 3) // 100 KiB each way
	if moved := sideWritten.Load() - before; moved != 200<<10 {
		t.Fatalf("%d bytes went on side connections, want the request's and the answer's 200 KiB", moved)
	}
	before = sideWritten.Load()
	for range 3 {
		echo(t, c)
	}
	if moved := sideWritten.Load() - before; moved != 0 {
		t.Fatalf("%d bytes of calls without TDs went on side connections", moved)
	}
	if got := clientConnOf(t, c).side.size(); got != 1 {
		t.Fatalf("%d side connections", got)
	}
}

func TestSide_Off(t *testing.T) {
	for _, tc := range []struct {
		name               string
		server, clientOpts []Option
	}{
		{"client", nil, []Option{WithSideConnections(false)}},
		{"server", []Option{WithSideConnections(false)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startStreamNode(t, tc.server...)
			c := dial(t, n.addr, tc.clientOpts...)
			before := sideWritten.Load()
			incCall(t, Uncompressed(testCtx(t)), c, 64, 16<<10, 1)
			if moved := sideWritten.Load() - before; moved != 0 {
				t.Fatalf("%d bytes went on side connections", moved)
			}
			if got := n.s.Stats().SideConns; got != 0 {
				t.Fatalf("the node has %d side connections", got)
			}
		})
	}
}

func TestSide_Stream(t *testing.T) {
	n := startStreamNode(t)
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	st, err := OpenStream[tick, tick](ctx, c, streamEcho, echoMsg{})
	must(t, err)
	defer st.Close()
	before := sideWritten.Load()
	for i := 1; i <= 8; i++ {
		must(t, st.Send(ctx, tick{I: i, X: Ref(byteTD(t, 64, 16<<10, byte(i)))}))
		got, err := st.Recv(ctx)
		must(t, err)
		b, _ := firstLeaf(t, got.X.TensorDict).Bytes()
		if len(b) != 1<<20 || b[0] != byte(i) || b[len(b)-1] != byte(i)+63 {
			t.Fatalf("message %d came back as %d bytes", i, len(b))
		}
	}
	if moved := sideWritten.Load() - before; moved != 16<<20 {
		t.Fatalf("%d bytes went on the side connection, want 16 MiB", moved)
	}
	must(t, st.CloseSend(ctx))
	if _, err := st.Recv(ctx); err != io.EOF {
		t.Fatalf("Recv after the end: %v", err)
	}
	st.Close()
	// Ended cleanly both ways: the side connection is back in the pool, and
	// the next call uses it.
	cc := clientConnOf(t, c)
	waitFor(t, "the stream's side connection back in the pool", func() bool {
		cc.side.mu.Lock()
		defer cc.side.mu.Unlock()
		return len(cc.side.idle) == 1
	})
	incCall(t, ctx, c, 64, 16<<10, 9)
	if got := cc.side.size(); got != 1 {
		t.Fatalf("the client has %d side connections, want 1", got)
	}
}

// TestSide_AttachRefused attaches side connections that must be refused: a
// wrong secret, no token or a wrong one on a node with a token. Each is
// refused with Unauthenticated, logged as a refused handshake, and
// attaches nothing; the session goes on.
func TestSide_AttachRefused(t *testing.T) {
	h := &countingHandler{}
	token := []byte("s3cret")
	n := startStreamNode(t, WithToken(token), WithLogger(slog.New(h)))
	c := dial(t, n.addr, WithToken(token))
	echo(t, c)
	secret := clientConnOf(t, c).session.secret
	var wrong [32]byte
	wrong[0] = 1
	for _, tc := range []struct {
		name   string
		token  []byte
		secret [32]byte
	}{
		{"wrong secret", token, wrong},
		{"no token", nil, secret},
		{"wrong token", []byte("guess"), secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, before := h.refusals()
			conn, err := net.Dial("tcp", n.addr)
			must(t, err)
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			_, err = clientHandshakeAttach(conn, ProtocolVersion, rootSide{}, tc.token, &attachMsg{id: 77, secret: tc.secret})
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("attach: %v, want Unauthenticated", err)
			}
			waitFor(t, "the refusal logged", func() bool { _, after := h.refusals(); return after == before+1 })
			if got := n.s.Stats().SideConns; got != 0 {
				t.Fatalf("the node has %d side connections", got)
			}
		})
	}
	echo(t, c)
	incCall(t, Uncompressed(testCtx(t)), c, 64, 16<<10, 1)
}

// TestSide_PoolLimit has more bulk calls in flight than side connections:
// the rest go in-band, and all succeed. Then the client dials past the
// node's limit: the node refuses the attach, and the calls go in-band.
func TestSide_PoolLimit(t *testing.T) {
	l := hostileLimits()
	l.MaxSideConns = 1
	h := &countingHandler{}
	n := startStreamNode(t, WithLimits(l), WithLogger(slog.New(h)))
	const callers = 4
	var barrier atomic.Pointer[sync.WaitGroup] // a new one each round
	newRound := func() {
		var wg sync.WaitGroup
		wg.Add(callers)
		barrier.Store(&wg)
	}
	newRound()
	must(t, Register(n.s, "test.barrier", func(ctx context.Context, req sinkReq) (Empty, error) {
		// Every call waits for all: they are in flight at once.
		wg := barrier.Load()
		wg.Done()
		wg.Wait()
		return Empty{}, nil
	}))
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	run := func() {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for i := range callers {
			td := byteTD(t, 64, 16<<10, byte(i))
			wg.Go(func() {
				_, err := Call[Empty](ctx, c, "test.barrier", sinkReq{X: Ref(td)})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			must(t, err)
		}
	}
	run()
	cc := clientConnOf(t, c)
	if got, want := cc.side.size(), 1; got != want {
		t.Fatalf("the client has %d side connections, want %d (the node's limit)", got, want)
	}
	// A client that dials past the node's limit is refused, and goes on.
	if _, refused := h.refusals(); refused != 0 {
		t.Fatalf("%d refused handshakes before the client dialed past the limit", refused)
	}
	cc.side.mu.Lock()
	cc.side.max = callers
	cc.side.mu.Unlock()
	newRound()
	run()
	if _, refused := h.refusals(); refused == 0 {
		t.Fatal("no refused attach logged")
	}
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections, want 1", got)
	}
	incCall(t, ctx, c, 64, 16<<10, 1)
}

// TestSide_SlowReader has a stream whose handler never reads: its sender
// blocks on its own side connection, while calls and other streams on the
// same client go on; its context's end fails its Send, closes its side
// connection, and leaves the rest working.
func TestSide_SlowReader(t *testing.T) {
	l := hostileLimits()
	l.MaxStreamBuffer = 1 << 20
	n := startStreamNode(t, WithLimits(l))
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := OpenStream[tick, Empty](sctx, c, streamBlock, Empty{})
	must(t, err)
	defer st.Close()
	<-n.streamStarted
	big := Ref(byteTD(t, 64, 1<<20, 5)) // 64 MiB: more than the socket buffers hold
	sent := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := st.Send(sctx, tick{I: i, X: big}); err != nil {
				sent <- err
				return
			}
		}
	}()
	// While that sender is blocked, others are served.
	for i := range 3 {
		incCall(t, ctx, c, 64, 16<<10, byte(i))
		echo(t, c)
	}
	other, err := OpenStream[tick, tick](ctx, c, streamEcho, echoMsg{})
	must(t, err)
	must(t, other.Send(ctx, tick{I: 1, X: Ref(byteTD(t, 64, 16<<10, 1))}))
	if _, err := other.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	must(t, other.CloseSend(ctx))
	if _, err := other.Recv(ctx); err != io.EOF {
		t.Fatalf("the other stream's end: %v", err)
	}
	other.Close() // ended cleanly: its side connection goes back to the pool
	select {
	case err := <-sent:
		t.Fatalf("the blocked sender returned: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-sent:
		if !errors.Is(err, ErrCanceled) {
			t.Fatalf("the blocked Send: %v, want Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the blocked Send did not return within 30 s of its context's end")
	}
	expectEnded(t, n.streamEnded)
	// Its side connection is closed on both ends, not reused.
	cc := clientConnOf(t, c)
	waitFor(t, "the cut side connection closed on both ends", func() bool {
		return n.s.Stats().SideConns == 1 && cc.side.size() == 1
	})
	incCall(t, ctx, c, 64, 16<<10, 7)
	echo(t, c)
}

// TestSide_SessionEnd closes the node: the side connections close with the
// session, on both ends, and the client dials a new session's.
func TestSide_SessionEnd(t *testing.T) {
	n := startStreamNode(t)
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	incCall(t, ctx, c, 64, 16<<10, 1)
	cc := clientConnOf(t, c)
	if cc.side.size() != 1 {
		t.Fatalf("the client has %d side connections", cc.side.size())
	}
	cc.sess.Close()
	waitFor(t, "the node's side connections closed", func() bool { return n.s.Stats().SideConns == 0 })
	waitFor(t, "the client's side connections closed", func() bool { return cc.side.size() == 0 })
	incCall(t, ctx, c, 64, 16<<10, 2)
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections after the new session's call, want 1", got)
	}
}

// TestSide_OlderNode: a version 2 node has no side connections; a version
// 3 client calls it in version 2, all in-band.
func TestSide_OlderNode(t *testing.T) {
	n := startStreamNode(t, func(o *options) { o.version = 2 })
	c := dial(t, n.addr)
	before := sideWritten.Load()
	incCall(t, Uncompressed(testCtx(t)), c, 64, 16<<10, 1)
	if cc := clientConnOf(t, c); cc.version != 2 || cc.side != nil {
		t.Fatalf("version %d, side pool %v", cc.version, cc.side)
	}
	if moved := sideWritten.Load() - before; moved != 0 {
		t.Fatalf("%d bytes went on side connections", moved)
	}
}

// TestStream_ReuseBuffers streams messages of distinct contents both ways
// with ReuseBuffers on both sides: every message arrives intact although
// the receiver reads ahead into reused memory.
func TestStream_ReuseBuffers(t *testing.T) {
	n := startStreamNode(t)
	must(t, RegisterStream(n.s, "test.stream.reuse", func(ctx context.Context, _ Empty, st *ServerStream[tick, tick]) error {
		st.ReuseBuffers()
		for {
			m, err := st.Recv(ctx)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			b, _ := firstLeaf(t, m.X.TensorDict).Bytes()
			for i, v := range b {
				if v != byte(m.I)+byte(i/(16<<10)) {
					return Errorf(DataLoss, "message %d byte %d is %d", m.I, i, v)
				}
			}
			if err := st.Send(ctx, tick{I: m.I, X: Ref(m.X.TensorDict)}); err != nil {
				return err
			}
		}
	}))
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	st, err := OpenStream[tick, tick](ctx, c, "test.stream.reuse", Empty{})
	must(t, err)
	defer st.Close()
	st.ReuseBuffers()
	const msgs = 40
	go func() {
		for i := range msgs {
			if err := st.Send(ctx, tick{I: i, X: Ref(byteTD(t, 20, 16<<10, byte(i)))}); err != nil {
				return
			}
		}
		st.CloseSend(ctx)
	}()
	for i := range msgs {
		m, err := st.Recv(ctx)
		must(t, err)
		b, _ := firstLeaf(t, m.X.TensorDict).Bytes()
		for j, v := range b {
			if m.I != i || v != byte(i)+byte(j/(16<<10)) {
				t.Fatalf("message %d (%d) byte %d is %d", i, m.I, j, v)
			}
		}
	}
	if _, err := st.Recv(ctx); err != io.EOF {
		t.Fatalf("the end: %v", err)
	}
}

// TestStream_RecvHeld: with ReuseBuffers, a message received with
// RecvHeld keeps its bytes while later messages arrive and are released
// (their memory reused), until it is released itself; release may be
// called twice. Recv releasing the message before it would show here as a
// held message overwritten by a later one.
func TestStream_RecvHeld(t *testing.T) {
	n := startStreamNode(t)
	const msgs = 24
	must(t, RegisterStream(n.s, "test.stream.held", func(ctx context.Context, _ Empty, st *ServerStream[tick, tick]) error {
		for i := range msgs {
			if err := st.Send(ctx, tick{I: i, X: Ref(byteTD(t, 4, 16<<10, byte(i)))}); err != nil {
				return err
			}
		}
		return nil
	}))
	check := func(m tick, i int) {
		t.Helper()
		b, _ := firstLeaf(t, m.X.TensorDict).Bytes()
		for j, v := range b {
			if m.I != i || v != byte(i)+byte(j/(16<<10)) {
				t.Fatalf("message %d (%d) byte %d is %d", i, m.I, j, v)
			}
		}
	}
	for _, reuse := range []bool{true, false} {
		t.Run(fmt.Sprintf("reuse=%v", reuse), func(t *testing.T) {
			c := dial(t, n.addr)
			ctx := Uncompressed(testCtx(t))
			st, err := OpenStream[tick, tick](ctx, c, "test.stream.held", Empty{})
			must(t, err)
			defer st.Close()
			if reuse {
				st.ReuseBuffers()
			}
			var kept []tick // every third message, held to the end
			for i := range msgs {
				m, release, err := st.RecvHeld(ctx)
				must(t, err)
				check(m, i)
				if i%3 == 0 {
					kept = append(kept, m)
					continue
				}
				release()
				release()
			}
			if _, _, err := st.RecvHeld(ctx); err != io.EOF {
				t.Fatalf("the end: %v", err)
			}
			for k, m := range kept {
				check(m, 3*k)
			}
		})
	}
}

// TestSide_DeadIdleConns closes idle side connections under each end: the
// client does not reuse one its node closed, and a node at its limit drops
// one its client closed to make room for a new one; bulk bodies keep going
// on side connections.
func TestSide_DeadIdleConns(t *testing.T) {
	l := hostileLimits()
	l.MaxSideConns = 1
	n := startStreamNode(t, WithLimits(l))
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	bulk := func() {
		t.Helper()
		before := sideWritten.Load()
		incCall(t, ctx, c, 64, 16<<10, 1)
		if moved := sideWritten.Load() - before; moved != 2<<20 {
			t.Fatalf("%d bytes went on side connections, want 2 MiB", moved)
		}
	}
	bulk()
	cc := clientConnOf(t, c)
	idle := func() *sideConn {
		cc.side.mu.Lock()
		defer cc.side.mu.Unlock()
		if len(cc.side.idle) != 1 {
			t.Fatalf("%d idle side connections", len(cc.side.idle))
		}
		return cc.side.idle[0]
	}

	// The node closes it (as it would on a failure the client missed).
	pc := peerOf(t, n.s)
	pc.side.mu.Lock()
	for _, sc := range pc.side.conns {
		sc.conn.Close()
	}
	pc.side.mu.Unlock()
	first := idle()
	bulk()
	if !first.dead.Load() || idle() == first {
		t.Fatal("the client reused a side connection its node closed")
	}

	// The client's end goes away without a word to the node, whose set is
	// at its limit: the next attach takes its place.
	second := idle()
	second.conn.Close()
	bulk()
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections, want 1", got)
	}
}

// TestSide_TakeWaitsForRelease names, in a call, a side connection the node
// still counts as held by the call before (the client may reuse it as soon
// as it has read that call's answer, a moment before the node's side of the
// call gives it back): the node waits for it instead of refusing the body.
func TestSide_TakeWaitsForRelease(t *testing.T) {
	n := startStreamNode(t)
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	incCall(t, ctx, c, 64, 16<<10, 1)
	pc := peerOf(t, n.s)
	held := pc.side.take(1, time.Now().Add(30*time.Second))
	if held == nil {
		t.Fatal("side connection 1 is not on the node")
	}
	done := make(chan error, 1)
	go func() {
		td := byteTD(t, 64, 16<<10, 2)
		_, err := Call[Empty](ctx, c, methodIncTD, sinkReq{X: TD{TensorDict: td, Out: true}})
		done <- err
	}()
	select {
	case err := <-done:
		// Only a machine too slow to reach the node in 200 ms gets here
		// without the bug; with it, the call fails at once.
		if err != nil {
			t.Fatalf("a call naming a side connection the node still held: %v", err)
		}
	case <-time.After(200 * time.Millisecond):
	}
	pc.side.put(held, true)
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the call did not end within 30 s of the side connection's release")
	}
}

// TestSide_RequestOnSideOnly: a bulk call that holds a side connection
// sends its whole request there: neither end's main connection reads a
// byte for it (a keep-alive may fall into one call, not into three).
func TestSide_RequestOnSideOnly(t *testing.T) {
	n := startStreamNode(t)
	c := dial(t, n.addr)
	ctx := Uncompressed(testCtx(t))
	incCall(t, ctx, c, 64, 16<<10, 1) // the side connection is open
	cc := clientConnOf(t, c)
	pc := peerOf(t, n.s)
	quiet := false
	for i := range 3 {
		nodeReads, callerReads := pc.fc.reads.Load(), cc.fc.reads.Load()
		before := sideWritten.Load()
		incCall(t, ctx, c, 64, 16<<10, byte(i))
		if moved := sideWritten.Load() - before; moved != 2<<20 {
			t.Fatalf("%d bytes went on side connections, want 2 MiB", moved)
		}
		if pc.fc.reads.Load() == nodeReads && cc.fc.reads.Load() == callerReads {
			quiet = true
			break
		}
	}
	if !quiet {
		t.Fatal("every bulk call moved bytes on the main connection")
	}
}

// TestSide_GarbageOnIdleConn writes bytes that are no request to an idle
// side connection: the node closes it and logs that once; the session, and
// bulk calls on a new side connection, go on.
func TestSide_GarbageOnIdleConn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		garbage []byte
	}{
		{"not msgpack", []byte{sideCallTag, 0, 0, 0, 4, 0xc1, 0xc1, 0xc1, 0xc1}},
		{"a message stream's request", append([]byte{sideCallTag}, frameOf(t, &requestHeader{Method: "x", Stream: true})...)},
		{"naming a side connection", append([]byte{sideCallTag}, frameOf(t, &requestHeader{Method: "x", Side: 1})...)},
		{"header too long", []byte{sideCallTag, 0x7f, 0xff, 0xff, 0xff}},
		{"no call's tag, and no stream takes it", frameOf(t, &requestHeader{Method: "x"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &countingHandler{}
			n := startStreamNode(t, WithLogger(slog.New(h)))
			c := dial(t, n.addr)
			ctx := Uncompressed(testCtx(t))
			incCall(t, ctx, c, 64, 16<<10, 1)
			cc := clientConnOf(t, c)
			cc.side.mu.Lock()
			sc := cc.side.idle[0]
			cc.side.mu.Unlock()
			if _, err := sc.conn.Write(tc.garbage); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the node closing the side connection", func() bool { return n.s.Stats().SideConns == 0 })
			if got := h.count("rpc: closing side connection"); got != 1 {
				t.Fatalf("%d log lines of the closed side connection, want 1", got)
			}
			echo(t, c)
			incCall(t, ctx, c, 64, 16<<10, 2) // on a new side connection
		})
	}
}

// frameOf returns hdr as a frame: its length and its msgpack.
func frameOf(t testing.TB, hdr header) []byte {
	t.Helper()
	b := hdr.appendMsgpack(make([]byte, 4))
	b[0], b[1], b[2], b[3] = byte((len(b)-4)>>24), byte((len(b)-4)>>16), byte((len(b)-4)>>8), byte(len(b)-4)
	return b
}

// count returns how many records have msg as their message.
func (h *countingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if r.Message == msg {
			n++
		}
	}
	return n
}

// TestSide_CancelEndsHandler cancels a call whose request went on a side
// connection while its handler runs: the caller's close of the side
// connection ends the handler's context, and the node serves the next calls.
//
// The handler's response then cannot be written (its side connection is
// gone): the node logs that at Debug, a caller's normal way to leave, not
// at Warn, as it did ("rpc: response ... use of closed network
// connection", which the README's main job printed when its trainer left
// a sample call behind).
func TestSide_CancelEndsHandler(t *testing.T) {
	h := &countingHandler{}
	n := startStreamNode(t, WithLogger(slog.New(h)))
	started, ended := make(chan struct{}, 1), make(chan struct{}, 1)
	must(t, Register(n.s, "test.blocktd", func(ctx context.Context, req sinkReq) (genResp, error) {
		started <- struct{}{}
		<-ctx.Done()
		ended <- struct{}{}
		return genResp{}, ctx.Err()
	}))
	c := dial(t, n.addr)
	ctx, cancel := context.WithCancel(Uncompressed(testCtx(t)))
	done := make(chan error, 1)
	before := sideWritten.Load()
	go func() {
		_, err := Call[genResp](ctx, c, "test.blocktd", sinkReq{X: Ref(byteTD(t, 64, 16<<10, 1))})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start")
	}
	if moved := sideWritten.Load() - before; moved != 1<<20 {
		t.Fatalf("%d bytes went on side connections, want the request's 1 MiB", moved)
	}
	cancel()
	if err := <-done; !errors.Is(err, ErrCanceled) {
		t.Fatalf("the cancelled call: %v, want Canceled", err)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context did not end within 30 s of the cancel")
	}
	waitFor(t, "the cancelled call's side connection closed", func() bool { return n.s.Stats().SideConns == 0 })
	incCall(t, Uncompressed(testCtx(t)), c, 64, 16<<10, 2)
	var level slog.Level
	waitFor(t, "the unwritten response logged", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, r := range h.records {
			if strings.HasPrefix(r.Message, "rpc: response") {
				level = r.Level
				return true
			}
		}
		return false
	})
	if level >= slog.LevelWarn {
		t.Errorf("a response its caller abandoned was logged at %v, want below Warn", level)
	}
}

// peerOf returns s's one peer, once its main connection is counted: calls
// on side connections can end before it is.
func peerOf(t *testing.T, s *Server) *peerConn {
	t.Helper()
	var pc *peerConn
	waitFor(t, "the peer counted", func() bool {
		s.mu.RLock()
		defer s.mu.RUnlock()
		for p := range s.conns {
			pc = p
		}
		return pc != nil
	})
	return pc
}

// TestSide_StreamEndedByHandlerThenCloseSend: a caller that reads a
// stream to its end (the handler returned) and then closes its side gives
// its side connection back in step: the next stream that takes it is
// served at once. Before, the caller's end was not written once the
// handler's had come, and the node held the connection, waiting for it,
// for TransferGrace (a minute here; the loader's FuzzConsumer saw 10 s).
func TestSide_StreamEndedByHandlerThenCloseSend(t *testing.T) {
	l := DefaultLimits()
	l.TransferGrace = time.Minute
	n := startStreamNode(t, WithLimits(l))
	lc := DefaultLimits()
	lc.MaxSideConns = 1 // every stream takes the same side connection
	c := dial(t, n.addr, WithLimits(lc))
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		st, err := OpenStream[Empty, tick](ctx, c, streamTicks, tickReq{N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(ctx); err != nil {
			t.Fatalf("stream %d: %v (the node still held its side connection?)", i, err)
		}
		if _, err := st.Recv(ctx); err != io.EOF {
			t.Fatalf("stream %d after its tick: %v, want io.EOF", i, err)
		}
		if err := st.CloseSend(ctx); err != nil {
			t.Fatalf("stream %d: CloseSend after the handler's end: %v", i, err)
		}
		st.Close()
		cancel()
	}
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections of the client, want its one: the streams did not use it", got)
	}
}

type sideHoldReq struct {
	X TD `codec:"x"`
}

type sideSmallResp struct {
	X TD `codec:"x"`
}

// TestSide_CallOnConnectionAStreamGaveBack: a caller may use a message
// stream's side connection for its next call as soon as both ends are
// through (protocol.md), before the node's side of the stream is done
// reading; the call is served. The node's stream reader, late (waiting
// here for the session's body budget, which another call holds), reads
// the caller's end frame and the call's request behind it together: what
// it read past its end goes back with the connection. It failed before:
// the node gave the connection back and dropped those bytes with the
// stream's reader, so its request reader never saw the call, which hung
// until its deadline.
func TestSide_CallOnConnectionAStreamGaveBack(t *testing.T) {
	lim := Limits{MaxBodyBytes: 3 << 19} // 1.5 MiB for the session's bodies
	s, addr := startServer(t, WithLimits(lim))
	holding, letGo := make(chan struct{}, 1), make(chan struct{})
	must(t, Register(s, "test.hold", func(ctx context.Context, req sideHoldReq) (Empty, error) {
		holding <- struct{}{}
		<-letGo // holds 1 MiB of the session's budget until then
		return Empty{}, nil
	}))
	must(t, Register(s, "test.small", func(ctx context.Context, req Empty) (sideSmallResp, error) {
		return sideSmallResp{X: Ref(byteTD(t, 4, 4, 1))}, nil
	}))
	quit := make(chan struct{})
	must(t, RegisterStream(s, "test.quit", func(ctx context.Context, req Empty, st *ServerStream[tick, Empty]) error {
		<-quit
		return nil
	}))
	lc := DefaultLimits()
	lc.MaxSideConns = 2 // the held call's and the stream's, which the call below takes
	c := dial(t, addr, WithCompression(false), WithLimits(lc))
	ctx := testCtx(t)
	held := make(chan error, 1)
	go func() {
		_, err := Call[Empty](ctx, c, "test.hold", sideHoldReq{X: Ref(byteTD(t, 1024, 1024, 0))})
		held <- err
	}()
	<-holding
	st, err := OpenStream[tick, Empty](ctx, c, "test.quit", Empty{})
	must(t, err)
	defer st.Close()
	// 1 MiB: the node's reader waits for the session's budget, which the
	// held call has.
	must(t, st.Send(ctx, tick{X: Ref(byteTD(t, 1024, 1024, 3))}))
	time.Sleep(200 * time.Millisecond)
	close(quit)
	if _, err := st.Recv(ctx); err != io.EOF {
		t.Fatalf("the handler's end: %v", err)
	}
	must(t, st.CloseSend(ctx)) // both ends through: the side connection is back in the pool
	called := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := Call[sideSmallResp](cctx, c, "test.small", Empty{})
		called <- err
	}()
	time.Sleep(300 * time.Millisecond) // the call's request is in the socket
	close(letGo)
	if err := <-held; err != nil {
		t.Fatalf("the held call: %v", err)
	}
	if err := <-called; err != nil {
		t.Fatalf("a call on the side connection the stream gave back: %v (its request was read, and dropped, by the stream's reader with the caller's end frame)", err)
	}
}

// TestSideSet_StartWhileTaken: a message stream takes a side connection
// whose reader runs (take marks it busy, then stops the reader outside the
// set's lock) while the session starts it (start, under the lock): start
// must leave a busy connection alone, its watchDone included. Before, it
// read watchDone first, as unwatch wrote it: a data race the race detector
// reported in CI (2026-11-30, TestSide_StreamEndedByHandlerThenCloseSend).
// Run under -race, as CI does, this fails without the fix.
func TestSideSet_StartWhileTaken(t *testing.T) {
	srv, err := NewServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for range 20 {
		s := newSideSet(srv, slog.New(slog.DiscardHandler), 4)
		a, b := net.Pipe()
		sc := &sideConn{id: 1, conn: a}
		s.conns[1] = sc
		s.start(sc) // a reader runs, blocked on the pipe
		var wg sync.WaitGroup
		var got *sideConn
		wg.Go(func() { got = s.take(1, time.Now().Add(5*time.Second)) })
		wg.Go(func() { s.start(sc) })
		wg.Wait()
		if got != sc {
			t.Fatalf("take: %v, want the connection", got)
		}
		s.mu.Lock()
		busy := s.busy[1]
		s.mu.Unlock()
		if !busy {
			t.Fatal("the taken connection is not busy")
		}
		a.Close()
		b.Close()
		s.close()
	}
}
