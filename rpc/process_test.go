package rpc

// Tests with the peer in another process, killed with SIGKILL while a call
// is in flight. The other process is this test binary run again with
// -test.run=^TestHelperProcess$ and TENSORWIRE_TEST_HELPER saying what to
// be: a node ("node") or a caller ("caller").

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Environment of a helper process.
const (
	envHelper = "TENSORWIRE_TEST_HELPER" // "node", "caller", "streamer" or "sidestreamer"
	envAddr   = "TENSORWIRE_TEST_ADDR"   // node: where to listen; caller: whom to call
	envRoot   = "TENSORWIRE_TEST_ROOT"   // node: its root, if any
)

// methodSlow is the helper node's method that blocks until its caller goes
// away; it prints "SLOW" when it starts.
const methodSlow = "test.slow"

// TestHelperProcess is not a test: it is the body of the helper processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(envHelper) {
	case "node":
		helperNode(t)
	case "caller":
		helperCaller()
	case "streamer":
		helperStreamer()
	case "sidestreamer":
		helperSideStreamer()
	case "sidecaller":
		helperSideCaller()
	default:
		t.Skip("the body of a helper process")
	}
}

// helperNode serves test.echo, test.slow, the test streams and the TD calls
// of the compression tests on $TENSORWIRE_TEST_ADDR (or a free port),
// prints "ADDR host:port", and serves until killed.
func helperNode(t *testing.T) {
	var opts []Option
	if root := os.Getenv(envRoot); root != "" {
		opts = append(opts, WithRoot(root))
	}
	s, err := NewServer(opts...)
	if err != nil {
		helperFail(err)
	}
	Register(s, methodEcho, func(ctx context.Context, m echoMsg) (echoMsg, error) { return m, nil })
	registerTestStreams(t, s, nil)
	registerTDCalls(t, s)
	Register(s, methodSlow, func(ctx context.Context, m echoMsg) (echoMsg, error) {
		fmt.Println("SLOW")
		select {
		case <-ctx.Done():
		case <-time.After(time.Minute):
		}
		return m, ctx.Err()
	})
	addr := os.Getenv(envAddr)
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := proctest.Listen(addr)
	if err != nil {
		helperFail(err)
	}
	fmt.Println("ADDR", l.Addr())
	helperFail(s.Serve(l))
}

// helperCaller dials $TENSORWIRE_TEST_ADDR, prints "CALLING" and calls
// test.block, which does not return until the caller is killed.
func helperCaller() {
	c, err := Dial(context.Background(), os.Getenv(envAddr))
	if err != nil {
		helperFail(err)
	}
	fmt.Println("CALLING")
	_, err = Call[echoMsg](context.Background(), c, methodBlock, echoMsg{})
	helperFail(fmt.Errorf("test.block returned: %v", err))
}

// helperStreamer dials $TENSORWIRE_TEST_ADDR, opens test.stream.block,
// sends it a message, prints "STREAMING", and waits to be killed.
func helperStreamer() {
	c, err := Dial(context.Background(), os.Getenv(envAddr))
	if err != nil {
		helperFail(err)
	}
	st, err := OpenStream[tick, Empty](context.Background(), c, streamBlock, Empty{})
	if err != nil {
		helperFail(err)
	}
	if err := st.Send(context.Background(), tick{I: 1}); err != nil {
		helperFail(err)
	}
	fmt.Println("STREAMING")
	_, err = st.Recv(context.Background())
	helperFail(fmt.Errorf("test.stream.block ended: %v", err))
}

// helperSideStreamer dials $TENSORWIRE_TEST_ADDR, opens test.stream.block
// and sends it 64 MiB messages, which go on a side connection: the node
// reads the first ahead and then none, so the second blocks mid-body. It
// prints "STREAMING" before the second, and waits to be killed.
func helperSideStreamer() {
	c, err := Dial(context.Background(), os.Getenv(envAddr))
	if err != nil {
		helperFail(err)
	}
	ctx := Uncompressed(context.Background())
	st, err := OpenStream[tick, Empty](ctx, c, streamBlock, Empty{})
	if err != nil {
		helperFail(err)
	}
	x, err := tensordict.Zeros(memmap.Uint8, 64, 1<<20)
	if err != nil {
		helperFail(err)
	}
	td, _ := tensordict.New(64)
	td.Set("x", x)
	for i := 0; ; i++ {
		if i == 1 {
			fmt.Println("STREAMING")
		}
		if err := st.Send(ctx, tick{I: i, X: Ref(td)}); err != nil {
			helperFail(fmt.Errorf("send %d: %w", i, err))
		}
	}
}

// helperSideCaller dials $TENSORWIRE_TEST_ADDR, takes a side connection
// and writes on it a call's tag, a header announcing a 64 MiB body, and 1
// MiB of it; it prints "SENT" and waits to be killed.
func helperSideCaller() {
	c, err := Dial(context.Background(), os.Getenv(envAddr))
	if err != nil {
		helperFail(err)
	}
	cc, err := c.conn(context.Background())
	if err != nil {
		helperFail(err)
	}
	side := cc.getSide(context.Background(), true)
	if side == nil {
		helperFail(errors.New("no side connection"))
	}
	hdr := requestHeader{Method: methodIncTD, BodyLen: 64 << 20}
	b := hdr.appendMsgpack([]byte{sideCallTag, 0, 0, 0, 0})
	binary.BigEndian.PutUint32(b[1:], uint32(len(b)-5))
	if _, err := side.conn.Write(append(b, make([]byte, 1<<20)...)); err != nil {
		helperFail(err)
	}
	fmt.Println("SENT")
	select {}
}

func helperFail(err error) {
	fmt.Fprintln(os.Stderr, "helper:", err)
	os.Exit(3)
}

// startHelper runs the helper process as role with env added
// (internal/testkit/proctest).
func startHelper(t *testing.T, role string, env ...string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, append([]string{envHelper + "=" + role}, env...)...)
}

// TestClient_NodeKilled kills the node while a call is in flight: the call
// fails with Unavailable when the socket closes (no watchdog to time out),
// and once a node listens on the same address again the same Client
// reaches it.
func TestClient_NodeKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	node := startHelper(t, "node", envRoot+"="+t.TempDir())
	addr := node.Expect(t, "ADDR")
	// No watchdog: only the socket's close can end the call in flight,
	// however long the kill takes to be seen on a busy machine.
	c := dial(t, addr, WithKeepAlive(-1))
	echo(t, c)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	call := Go[echoMsg](ctx, c, methodSlow, echoMsg{})
	node.Expect(t, "SLOW")
	killed := node.Kill()
	select {
	case <-call.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the call in flight did not end within 30 s of the kill")
	}
	took := time.Since(killed)
	if _, err := call.Wait(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the call in flight: %v, want Unavailable", err)
	}
	t.Logf("the call in flight failed %v after the kill", took)

	// While the node is down, calls fail at once with Unavailable.
	start := time.Now()
	if _, err := Call[echoMsg](ctx, c, methodEcho, echoMsg{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a call with the node down: %v, want Unavailable", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("a call with the node down took %v", took)
	}

	// A new node on the same address: the same Client dials it again.
	node = startHelper(t, "node", envAddr+"="+addr)
	if got := node.Expect(t, "ADDR"); got != addr {
		t.Fatalf("the new node listens on %s, want %s", got, addr)
	}
	echo(t, c)
	call = Go[echoMsg](ctx, c, methodSlow, echoMsg{})
	node.Expect(t, "SLOW")
	node.Kill()
	if _, err := call.Wait(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the call in flight on the second node: %v, want Unavailable", err)
	}
}

// TestServer_CallerKilled kills a caller while its call runs: the handler's
// context ends when the socket closes (the server sends no pings to time
// out), and the node serves others.
func TestServer_CallerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := startTestNode(t, WithKeepAlive(-1)) // no pings: only the socket's close can end the call
	caller := startHelper(t, "caller", envAddr+"="+n.addr)
	caller.Expect(t, "CALLING")
	select {
	case <-n.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the caller's call did not start")
	}
	killed := caller.Kill()
	select {
	case err := <-n.ended:
		if err == nil {
			t.Fatal("the handler returned without its context ending")
		}
		took := time.Since(killed)
		t.Logf("the handler's context ended %v after the kill", took)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context did not end within 30 s of the kill")
	}
	echo(t, dial(t, n.addr))
}

// TestStream_NodeKilled kills the node under open streams: a Recv waiting
// for a message and one on a stream the node was sending on fail with
// Unavailable at once.
func TestStream_NodeKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	node := startHelper(t, "node")
	addr := node.Expect(t, "ADDR")
	l := DefaultLimits()
	l.MaxStreamBuffer = 64 << 10 // what a Recv drains before the error
	c := dial(t, addr, WithLimits(l))
	ctx := testCtx(t)
	waiting, err := OpenStream[tick, Empty](ctx, c, streamBlock, Empty{})
	must(t, err)
	defer waiting.Close()
	node.Expect(t, "BLOCKING")
	ticking, err := OpenStream[Empty, tick](ctx, c, streamTicks, tickReq{})
	must(t, err)
	defer ticking.Close()
	if _, err := ticking.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	killed := node.Kill()
	// Unavailable, and not io.EOF, which a Recv loop takes for the
	// handler's clean end.
	if _, err := waiting.Recv(ctx); !errors.Is(err, ErrUnavailable) || errors.Is(err, io.EOF) {
		t.Fatalf("a waiting Recv after the kill: %v (io.EOF: %v), want Unavailable, not io.EOF", err, errors.Is(err, io.EOF))
	}
	for {
		_, err := ticking.Recv(ctx)
		if err == nil {
			continue // ticks read before the kill
		}
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, io.EOF) {
			t.Fatalf("the ticking stream after the kill: %v (io.EOF: %v), want Unavailable, not io.EOF", err, errors.Is(err, io.EOF))
		}
		break
	}
	took := time.Since(killed)
	if took > 2*time.Second {
		t.Fatalf("the streams failed %v after the kill, want under 2 s", took)
	}
	t.Logf("the streams failed %v after the kill", took)
}

// TestStream_CallerKilled kills a caller with a stream open: the handler's
// context ends at once, and the node serves others.
func TestStream_CallerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := startStreamNode(t)
	caller := startHelper(t, "streamer", envAddr+"="+n.addr)
	caller.Expect(t, "STREAMING")
	select {
	case <-n.streamStarted:
	case <-time.After(20 * time.Second):
		t.Fatal("the caller's stream did not start")
	}
	killed := caller.Kill()
	expectEnded(t, n.streamEnded)
	took := time.Since(killed)
	if took > 2*time.Second {
		t.Fatalf("the handler's context ended %v after the kill, want under 2 s", took)
	}
	t.Logf("the handler's context ended %v after the kill", took)
	echo(t, dial(t, n.addr))
}

// TestCompression_Processes sends Atari frames to a node in another
// process, in a call and in a stream: compressed both ways, and intact.
func TestCompression_Processes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	node := startHelper(t, "node")
	f := proctest.StartProxy(t, node.Expect(t, "ADDR"))
	c := dial(t, f.Addr)
	ctx := testCtx(t)
	td := atariTD(32)
	x := firstLeaf(t, td)
	want, _ := x.Bytes()
	want = bytes.Clone(want)
	raw := int64(len(want))

	up0, dn0 := f.Up.Load(), f.Down.Load()
	if _, err := Call[Empty](ctx, c, methodIncTD, sinkReq{X: TD{TensorDict: td, Out: true}}); err != nil {
		t.Fatal(err)
	}
	got, _ := x.Bytes()
	for i := range want {
		if got[i] != want[i]+1 {
			t.Fatalf("byte %d came back as %d, want %d", i, got[i], want[i]+1)
		}
	}
	if up, dn := f.Up.Load()-up0, f.Down.Load()-dn0; up > raw/4 || dn > raw/4 {
		t.Fatalf("a call of %d bytes each way: %d up, %d down", raw, up, dn)
	}

	st, err := OpenStream[tick, tick](ctx, c, streamEcho, echoMsg{})
	must(t, err)
	defer st.Close()
	up0, dn0 = f.Up.Load(), f.Down.Load()
	const msgs = 8
	for i := range msgs {
		must(t, st.Send(ctx, tick{I: i, X: Ref(atariTD(32))}))
		m, err := st.Recv(ctx)
		must(t, err)
		b, _ := firstLeaf(t, m.X.TensorDict).Bytes()
		if !bytes.Equal(b, want) {
			t.Fatalf("message %d came back changed", i)
		}
	}
	if up, dn := f.Up.Load()-up0, f.Down.Load()-dn0; up > msgs*raw/4 || dn > msgs*raw/4 {
		t.Fatalf("%d stream messages of %d bytes each way: %d up, %d down", msgs, raw, up, dn)
	}
	t.Logf("%d bytes each way in a call and %d stream messages: %d up, %d down", raw, msgs, f.Up.Load(), f.Down.Load())
}

// TestSide_Processes moves bulk bodies on side connections between two
// processes: a call (the request's TD goes, comes back incremented) and a
// message stream (each message's TD echoed back).
func TestSide_Processes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	node := startHelper(t, "node")
	c := dial(t, node.Expect(t, "ADDR"))
	ctx := Uncompressed(testCtx(t))
	before := sideWritten.Load()
	for i := range 3 {
		incCall(t, ctx, c, 64, 64<<10, byte(i)) // 4 MiB
	}
	st, err := OpenStream[tick, tick](ctx, c, streamEcho, echoMsg{})
	must(t, err)
	defer st.Close()
	for i := 1; i <= 4; i++ {
		must(t, st.Send(ctx, tick{I: i, X: Ref(byteTD(t, 64, 64<<10, byte(i)))}))
		got, err := st.Recv(ctx)
		must(t, err)
		b, _ := firstLeaf(t, got.X.TensorDict).Bytes()
		if len(b) != 4<<20 || b[0] != byte(i) || b[len(b)-1] != byte(i)+63 {
			t.Fatalf("message %d came back as %d bytes", i, len(b))
		}
	}
	must(t, st.CloseSend(ctx))
	if _, err := st.Recv(ctx); err != io.EOF {
		t.Fatalf("the stream's end: %v", err)
	}
	// This process wrote the requests and the stream's messages there.
	if moved := sideWritten.Load() - before; moved != 3*4<<20+4*4<<20 {
		t.Fatalf("this process wrote %d bytes on side connections, want %d", moved, 7*4<<20)
	}
}

// TestSide_NodeKilledMidBody kills the node while a stream's sender is
// blocked writing a body on its side connection: the Send fails promptly
// with Unavailable, and a call on the same client fails the same way.
func TestSide_NodeKilledMidBody(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	node := startHelper(t, "node")
	c := dial(t, node.Expect(t, "ADDR"))
	ctx := Uncompressed(testCtx(t))
	st, err := OpenStream[tick, Empty](ctx, c, streamBlock, Empty{})
	must(t, err)
	defer st.Close()
	node.Expect(t, "BLOCKING")
	big := Ref(byteTD(t, 64, 1<<20, 1))
	// The node reads the first message ahead; the second blocks mid-body.
	must(t, st.Send(ctx, tick{I: 0, X: big}))
	sent := make(chan error, 1)
	go func() { sent <- st.Send(ctx, tick{I: 1, X: big}) }()
	if clientConnOf(t, c).side.size() != 1 {
		t.Fatal("the stream holds no side connection")
	}
	killed := node.Kill()
	select {
	case err := <-sent:
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("the Send cut by the kill: %v, want Unavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the Send did not fail within 30 s of the kill")
	}
	t.Logf("the Send failed %v after the kill", time.Since(killed))
	if _, err := Call[echoMsg](ctx, c, methodEcho, echoMsg{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a call after the kill: %v, want Unavailable", err)
	}
}

// TestSide_CallerKilledMidBody kills a caller blocked writing a stream
// message's body on its side connection: the handler's context ends, the
// side connection is closed, and the node serves others, bulk calls on side
// connections included.
func TestSide_CallerKilledMidBody(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := startStreamNode(t, WithKeepAlive(-1)) // no pings: only the sockets' close ends it
	caller := startHelper(t, "sidestreamer", envAddr+"="+n.addr)
	caller.Expect(t, "STREAMING")
	select {
	case <-n.streamStarted:
	case <-time.After(30 * time.Second):
		t.Fatal("the caller's stream did not start")
	}
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections, want the stream's", got)
	}
	killed := caller.Kill()
	expectEnded(t, n.streamEnded)
	t.Logf("the handler's context ended %v after the kill", time.Since(killed))
	waitFor(t, "the dead caller's side connection closed", func() bool { return n.s.Stats().SideConns == 0 })
	c := dial(t, n.addr)
	echo(t, c)
	incCall(t, Uncompressed(testCtx(t)), c, 64, 64<<10, 3)
}

// TestSide_CallerKilledMidRequest kills a caller whose call's request
// stopped mid-body on its side connection: the node closes that side
// connection and serves others, bulk calls on side connections included.
func TestSide_CallerKilledMidRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := startStreamNode(t, WithKeepAlive(-1)) // no pings: only the sockets' close ends it
	caller := startHelper(t, "sidecaller", envAddr+"="+n.addr)
	caller.Expect(t, "SENT")
	if got := n.s.Stats().SideConns; got != 1 {
		t.Fatalf("the node has %d side connections, want the caller's", got)
	}
	caller.Kill()
	waitFor(t, "the dead caller's side connection closed", func() bool { return n.s.Stats().SideConns == 0 })
	c := dial(t, n.addr)
	echo(t, c)
	incCall(t, Uncompressed(testCtx(t)), c, 64, 64<<10, 3)
}
