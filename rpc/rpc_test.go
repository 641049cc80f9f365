package rpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// startServer serves s on a loopback listener until the test ends.
func startServer(t testing.TB, opts ...Option) (*Server, string) {
	t.Helper()
	opts = append([]Option{WithLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})))}, opts...)
	s, err := NewServer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, l.Addr().String()
}

func dial(t testing.TB, addr string, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// seedTD creates the seed's shape of storage, smaller: {"memmap": uint8 [n, 4, 4, 3]}.
func seedTD(t *testing.T, prefix string, n int) *tensordict.TensorDict {
	t.Helper()
	td, err := tensordict.Create(prefix, []int{n}, tensordict.Field{Key: []string{"memmap"}, DType: memmap.Uint8, Shape: []int{n, 4, 4, 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { td.Close() })
	return td
}

// rowsSet returns which rows of td's "memmap" leaf are entirely v.
func rowsSet(t *testing.T, td *tensordict.TensorDict, v byte) []int {
	t.Helper()
	x, err := td.Tensor("memmap")
	if err != nil {
		t.Fatal(err)
	}
	b, err := x.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	rb := x.RowBytes()
	var set []int
	for r := range x.Len() {
		all := true
		for _, c := range b[r*rb : (r+1)*rb] {
			all = all && c == v
		}
		if all {
			set = append(set, r)
		}
	}
	return set
}

func TestFill_SeedScenario(t *testing.T) {
	for _, tc := range []struct {
		name       string
		clientRoot bool
		wantShared bool
	}{
		{"shared filesystem, by reference", true, true},
		{"no shared root, by bytes", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			_, addr := startServer(t, WithRoot(root))
			var opts []Option
			if tc.clientRoot {
				opts = append(opts, WithRoot(root))
			}
			c := dial(t, addr, opts...)
			shared, err := c.SharedFS(context.Background())
			if err != nil || shared != tc.wantShared {
				t.Fatalf("SharedFS = %v, %v; want %v", shared, err, tc.wantShared)
			}
			td := seedTD(t, filepath.Join(root, "td"), 1000)
			ctx := context.Background()
			if err := c.Fill(ctx, td, []int{0, 1, 2, 3, 999}, 1); err != nil {
				t.Fatal(err)
			}
			if got := rowsSet(t, td, 1); !equalInts(got, []int{0, 1, 2, 3, 999}) {
				t.Fatalf("rows of ones after the first fill: %v", got)
			}
			if err := c.Fill(ctx, td, []int{4, 5, 6, 7, 998}, 1); err != nil {
				t.Fatal(err)
			}
			if got := rowsSet(t, td, 1); !equalInts(got, []int{0, 1, 2, 3, 4, 5, 6, 7, 998, 999}) {
				t.Fatalf("rows of ones after the second fill: %v", got)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFill_OutOfRangeChangesNothing(t *testing.T) {
	root := t.TempDir()
	_, addr := startServer(t, WithRoot(root))
	c := dial(t, addr, WithRoot(root))
	td := seedTD(t, filepath.Join(root, "td"), 10)
	err := c.Fill(context.Background(), td, []int{0, 10}, 1)
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
	if got := rowsSet(t, td, 1); len(got) != 0 {
		t.Fatalf("rows written by a refused fill: %v", got)
	}
}

type outBackReq struct {
	A TD `codec:"a"`
}

type outBackResp struct {
	R TD `codec:"r"`
}

// TestCall_OutWrittenBackOnlyWhenTheCallSucceeds: a request TD sent as
// bytes with Out comes back at the head of the response's body, but is
// written into the caller's TensorDict only once the whole body is in
// (protocol.md: "when out is set and the call succeeds"): a connection
// that breaks after the write-back's bytes, before the result's own TD's,
// fails the call and leaves the caller's TensorDict as it was. It failed
// before: each Out TD was written back as soon as its bytes were in.
func TestCall_OutWrittenBackOnlyWhenTheCallSucceeds(t *testing.T) {
	s, addr := startServer(t, WithCompression(false))
	must(t, Register(s, "test.outback", func(ctx context.Context, req outBackReq) (outBackResp, error) {
		if req.A.TensorDict == nil {
			return outBackResp{}, nil
		}
		x, err := req.A.Tensor("x")
		if err != nil {
			return outBackResp{}, err
		}
		b, _ := x.Bytes()
		for i := range b {
			b[i] = 9
		}
		return outBackResp{R: Ref(byteTD(t, 1024, 8<<10, 1))}, nil // 8 MiB after the write-back's 1 MiB
	}))
	p, paddr := startCutProxy(t, addr, 3<<20)
	c := dial(t, paddr, WithCompression(false), WithSideConnections(false))
	// A call first, so that the handshake is behind the proxy's count.
	if _, err := Call[outBackResp](testCtx(t), c, "test.outback", outBackReq{}); err != nil {
		t.Fatal(err)
	}
	mine := byteTD(t, 128, 8<<10, 0) // 1 MiB, row r holds byte r
	x, err := mine.Tensor("x")
	must(t, err)
	b, _ := x.Bytes()
	before := bytes.Clone(b)
	p.armed.Store(true)
	_, err = Call[outBackResp](testCtx(t), c, "test.outback", outBackReq{A: TD{TensorDict: mine, Out: true}})
	if err == nil {
		t.Fatal("the call succeeded; the proxy did not cut the response")
	}
	if !bytes.Equal(b, before) {
		t.Fatalf("the call failed (%v), yet the caller's Out TensorDict holds the handler's changes (byte 1 is %d, was %d)", err, b[1], before[1])
	}
}

// cutProxy relays TCP connections to addr; once armed, it cuts every
// connection after limit more bytes have gone from the node to the client.
type cutProxy struct {
	limit int64
	armed atomic.Bool
	sent  atomic.Int64
	mu    sync.Mutex
	conns []net.Conn
}

func startCutProxy(t *testing.T, addr string, limit int64) (*cutProxy, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := &cutProxy{limit: limit}
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() {
				defer c.Close()
				defer s.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						if p.armed.Load() {
							if left := p.limit - p.sent.Load(); int64(n) > left {
								c.Write(buf[:max(left, 0)])
								return
							}
							p.sent.Add(int64(n))
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p, l.Addr().String()
}

// Rows of a TensorDict without batch dimensions are refused by the client,
// even empty ones (they used to panic it while it built the bytes form).
func TestFill_RowsWithoutBatch(t *testing.T) {
	c := dial(t, startTestNode(t).addr)
	td, err := tensordict.New()
	if err != nil {
		t.Fatal(err)
	}
	x, err := tensordict.Zeros(memmap.Float32)
	if err != nil {
		t.Fatal(err)
	}
	if err := td.Set("x", x); err != nil {
		t.Fatal(err)
	}
	for _, rows := range [][]int{{}, {0}} {
		if err := c.Fill(context.Background(), td, rows, 1); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Fill of rows %v of a TensorDict without batch dimensions: %v, want InvalidArgument", rows, err)
		}
	}
	echo(t, c) // the client is still usable
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// TestResolver_ReleasesDeletedFiles checks that a node does not keep a
// deleted file mapped (and its disk space taken): the periodic sweep drops
// it, and so does the next reference to its name.
func TestResolver_ReleasesDeletedFiles(t *testing.T) {
	root := t.TempDir()
	s, addr := startServer(t, WithRoot(root))
	c := dial(t, addr, WithRoot(root))
	cached := func() int {
		s.res.mu.Lock()
		defer s.res.mu.Unlock()
		return len(s.res.cache)
	}
	var tds []*tensordict.TensorDict
	for _, name := range []string{"a", "b"} {
		td := seedTD(t, filepath.Join(root, name), 4)
		if err := c.Fill(context.Background(), td, []int{1}, 1); err != nil {
			t.Fatal(err)
		}
		tds = append(tds, td)
	}
	if n := cached(); n != 2 {
		t.Fatalf("%d mappings cached after two fills, want 2", n)
	}
	if err := os.RemoveAll(filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	s.res.sweep(time.Hour)
	if n := cached(); n != 1 {
		t.Fatalf("%d mappings cached after a file was deleted and swept, want 1", n)
	}
	if err := os.RemoveAll(filepath.Join(root, "b")); err != nil {
		t.Fatal(err)
	}
	// A reference to the deleted name: NotFound, and its entry is gone
	// without waiting for a sweep.
	if err := c.Fill(context.Background(), tds[1], []int{1}, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("fill of a deleted file: %v, want NotFound", err)
	}
	if n := cached(); n != 0 {
		t.Fatalf("%d mappings cached after every file was deleted, want 0", n)
	}
}

// TestFill_NoTensorBytesByReference checks the README's claim: with a
// shared filesystem, a remote fill of 1.25 MB of rows moves a few kilobytes
// over the connection; without one, the rows travel both ways (compressed
// unless compression is off: these rows are constant).
func TestFill_NoTensorBytesByReference(t *testing.T) {
	root := t.TempDir()
	_, addr := startServer(t, WithRoot(root))
	td, err := tensordict.Create(filepath.Join(root, "td"), []int{10},
		tensordict.Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{10, 256, 1024}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { td.Close() })
	rows := []int{0, 1, 2, 3, 9}
	const rowBytes = 256 * 1024
	for _, tc := range []struct {
		name     string
		opts     []Option
		min, max int64
	}{
		{"by reference", []Option{WithRoot(root)}, 0, 16 << 10},
		{"by bytes", []Option{WithCompression(false)}, 2 * int64(len(rows)) * rowBytes, 1 << 30},
		{"by bytes, compressed", nil, 0, 64 << 10},
	} {
		proxy := proctest.StartProxy(t, addr)
		c := dial(t, proxy.Addr, tc.opts...)
		if err := c.Fill(context.Background(), td, rows, 7); err != nil {
			t.Fatal(err)
		}
		c.Close()
		proxy.WaitIdle(t) // every byte counted
		n := proxy.Up.Load() + proxy.Down.Load()
		t.Logf("%s: %d bytes crossed", tc.name, n)
		if n < tc.min || n > tc.max {
			t.Errorf("%s: %d bytes crossed the connection, want [%d, %d]", tc.name, n, tc.min, tc.max)
		}
	}
}
