package rpc

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
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
