package nodeproc

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestMain lets Start re-execute the test binary as a node.
func TestMain(m *testing.M) {
	MaybeRunChild(nil)
	os.Exit(m.Run())
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode) // umask-free
		return p
	}
	tok, err := ReadToken(write("ok", "s3cret\r\n\n", 0o600))
	if err != nil || string(tok) != "s3cret" {
		t.Errorf("ReadToken = %q, %v; want s3cret", tok, err)
	}
	if tok, err := ReadToken(write("group", " spaced token ", 0o640)); err != nil || string(tok) != " spaced token " {
		t.Errorf("group-readable, inner spaces: %q, %v", tok, err)
	}
	for _, tc := range []struct{ name, content, want string }{
		{"empty", "", "empty"},
		{"newline", "\n", "empty"},
		{"world", "s3cret\n", "other users"},
	} {
		mode := os.FileMode(0o600)
		if tc.name == "world" {
			mode = 0o644
		}
		if _, err := ReadToken(write(tc.name, tc.content, mode)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	if _, err := ReadToken(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestTempToken checks that the token file is private, holds a 64-digit
// token ReadToken accepts, and that remove deletes its folder.
func TestTempToken(t *testing.T) {
	path, remove, err := TempToken()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ReadToken(path)
	if err != nil || len(tok) != 64 {
		t.Errorf("ReadToken = %q, %v; want 64 hex digits", tok, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode: %v, %v; want 0600", fi, err)
	}
	remove()
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after remove, the folder: %v", err)
	}
}

func TestRun_StopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Listen: "127.0.0.1:0", Root: t.TempDir(), Log: slog.New(slog.DiscardHandler)},
			func(addr string) { addrs <- addr })
	}()
	addr := <-addrs
	c, err := rpc.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Describe(ctx, "nothing"); !errors.Is(err, rpc.ErrNotFound) {
		t.Errorf("Describe of a missing prefix: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
}

// TestRun_StopsAtOnce: a node whose context ends as soon as it listens
// (before its accept loop starts, often) stops cleanly: nil, and its
// port free again. Before, Close could come before Serve, which then
// returned rpc.ErrServerClosed ("closing the node: rpc: server closed",
// exit 1: TestNode_NonLoopbackNeedsTokenOrInsecure under load) and left
// the listener open.
func TestRun_StopsAtOnce(t *testing.T) {
	for i := range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		var addr string
		err := Run(ctx, Config{Listen: "127.0.0.1:0", Log: slog.New(slog.DiscardHandler)}, func(a string) {
			addr = a
			cancel()
		})
		cancel()
		if err != nil {
			t.Fatalf("run %d: Run stopped at once: %v", i, err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("run %d: the node's port after Run returned: %v", i, err)
		}
		ln.Close()
	}
}

func TestRun_BadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Listen: "127.0.0.1:0", TLSCert: "cert.pem"},
		{Listen: "127.0.0.1:0", TokenFile: filepath.Join(t.TempDir(), "missing")},
		{Listen: "127.0.0.1:0", Root: filepath.Join(t.TempDir(), "missing")},
		{Listen: "nohost"},
	} {
		called := false
		if err := Run(context.Background(), cfg, func(string) { called = true }); err == nil || called {
			t.Errorf("%+v: err %v, ready called %v", cfg, err, called)
		}
	}
}

// TestStart_FillThenStop runs node B in a child process, fills rows of a
// TensorDict under the shared root through it, and stops it cleanly.
func TestStart_FillThenStop(t *testing.T) {
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := Start(ctx, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rpc.Dial(ctx, p.Addr, rpc.WithRoot(root)); !errors.Is(err, rpc.ErrUnauthenticated) {
		t.Errorf("dial without the token: %v, want Unauthenticated", err)
	}
	c, err := rpc.Dial(ctx, p.Addr, rpc.WithRoot(root), rpc.WithToken(p.Token))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	td, err := tensordict.Create(filepath.Join(root, "td"), []int{6},
		tensordict.Field{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{6, 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	if shared, err := c.SharedFS(ctx); !shared || err != nil {
		t.Fatalf("SharedFS = %v, %v", shared, err)
	}
	if err := c.Fill(ctx, td, []int{1, 4}, 2.5); err != nil {
		t.Fatal(err)
	}
	x, _ := td.Tensor("x")
	got, _ := tensordict.Values[float32](x)
	for i, v := range got {
		if want := map[bool]float32{true: 2.5}[i/3 == 1 || i/3 == 4]; v != want {
			t.Fatalf("element %d = %v, want %v (all: %v)", i, v, want, got)
		}
	}
	select {
	case <-p.Done():
		t.Fatal("Done is closed while the child runs")
	default:
	}
	if err := p.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	select {
	case <-p.Done():
	default:
		t.Error("Done is not closed after Stop")
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestSpawn_Failures checks that a child that fails before it listens, or
// prints something other than its address, is an error (and no panic), and
// that Spawn stops the child it started.
func TestSpawn_Failures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := Start(ctx, Options{Root: filepath.Join(t.TempDir(), "missing")}); err == nil || !strings.Contains(err.Error(), "exited before listening") {
		t.Errorf("Start with a missing root: %v", err)
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	_, err := Spawn(ctx, Child{Name: "sh", Path: "/bin/sh", Args: []string{"-c", `echo $$ >` + pidFile + `; echo hello; exec sleep 30`}})
	if err == nil || !strings.Contains(err.Error(), `sh printed "hello\n", not its address`) {
		t.Errorf("Spawn of a child printing hello: %v", err)
	}
	b, _ := os.ReadFile(pidFile)
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
		t.Errorf("the child (pid %q) is still running after Spawn failed", b)
	}
}

// TestSpawn_StderrWritesOneAtATime: a child's stderr and what it prints
// on stdout after its address both reach Child.Stderr, from two
// goroutines; Spawn must hand them to it one Write at a time (a plain
// bytes.Buffer there is what callers pass), and every line must arrive.
func TestSpawn_StderrWritesOneAtATime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &overlapWriter{}
	script := `echo ` + ListeningPrefix + `127.0.0.1:1; i=0; while [ $i -lt 200 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done; exec sleep 30`
	p, err := Spawn(ctx, Child{Name: "sh", Path: "/bin/sh", Args: []string{"-c", script}, Stderr: w})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := w.String()
		if strings.Contains(s, "out199\n") && strings.Contains(s, "err199\n") {
			for i := 0; i < 200; i++ {
				for _, k := range []string{"out", "err"} {
					if line := k + strconv.Itoa(i) + "\n"; !strings.Contains(s, line) {
						t.Fatalf("Child.Stderr lacks %q:\n%s", line, s)
					}
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Child.Stderr after 20s:\n%s", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := w.overlaps.Load(); n > 0 {
		t.Errorf("Child.Stderr was written by two goroutines at once %d times", n)
	}
}

// overlapWriter counts Writes that begin while another is in progress; each
// Write lingers a little so that unserialised writers do overlap.
type overlapWriter struct {
	busy, overlaps atomic.Int32
	mu             sync.Mutex
	buf            bytes.Buffer
}

func (w *overlapWriter) Write(b []byte) (int, error) {
	if !w.busy.CompareAndSwap(0, 1) {
		w.overlaps.Add(1)
	} else {
		defer w.busy.Store(0)
	}
	time.Sleep(200 * time.Microsecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}

func (w *overlapWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
