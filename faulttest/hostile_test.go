package faulttest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// honest is a well-behaved client that calls a node without pause
// throughout a scenario, each call with a 2 s deadline, and keeps count.
type honest struct {
	c     *rpc.Client
	calls atomic.Int64
	fails atomic.Int64
	slow  atomic.Int64 // the longest call, in nanoseconds
	heap  atomic.Uint64
	mu    sync.Mutex
	errs  []string
}

func (h *honest) run(ctx context.Context, prefix string) {
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		start := time.Now()
		_, err := h.c.Describe(cctx, prefix)
		var st rpc.Stats
		if err == nil {
			st, err = h.c.Stats(cctx)
		}
		took := time.Since(start)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.calls.Add(1)
		if err != nil {
			h.fails.Add(1)
			h.mu.Lock()
			h.errs = append(h.errs, err.Error())
			h.mu.Unlock()
		}
		if int64(took) > h.slow.Load() {
			h.slow.Store(int64(took))
		}
		if st.HeapBytes > h.heap.Load() {
			h.heap.Store(st.HeapBytes)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// attack is one kind of hostile peer: it runs against addr and returns how
// many attempts it made, or an error if the node answered in a way it must
// not (accepted garbage, let a reference out of the root).
type attack struct {
	name string
	run  func(ctx context.Context, a *attackEnv) (int, error)
}

type attackEnv struct {
	addr    string
	token   []byte
	fsid    []byte
	shared  string
	outside string // a file outside the shared root that must never change
}

// closedWithin reports whether the node closes conn within d, reading
// whatever it sends meanwhile.
func closedWithin(conn net.Conn, d time.Duration) bool {
	conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func attacks() []attack {
	return []attack{
		{"random bytes", func(ctx context.Context, a *attackEnv) (int, error) {
			return parallel(ctx, 200, 16, func(i int) error {
				conn, err := net.Dial("tcp", a.addr)
				if err != nil {
					return err
				}
				defer conn.Close()
				b := randBytes(1 + i*37%4096)
				if i%2 == 1 { // past the magic, garbage after it
					copy(b, hello(true, nil)[:min(len(b), 8)])
				}
				conn.Write(b)
				if !closedWithin(conn, 30*time.Second) {
					return fmt.Errorf("the node kept a connection that sent %d random bytes", len(b))
				}
				return nil
			})
		}},
		{"thousands of connections opened and dropped", func(ctx context.Context, a *attackEnv) (int, error) {
			return parallel(ctx, 3000, 32, func(i int) error {
				conn, err := net.Dial("tcp", a.addr)
				if err != nil {
					return err
				}
				switch i % 3 {
				case 1: // half a hello
					conn.Write(hello(true, nil)[:20])
				case 2: // a whole handshake, then gone without a goodbye
					if code, _, err := handshake(conn, a.token, nil); err != nil || code != 0 {
						conn.Close()
						return fmt.Errorf("honest handshake: code %d, %v", code, err)
					}
				}
				if tc, ok := conn.(*net.TCPConn); ok && i%2 == 0 {
					tc.SetLinger(0) // a reset, not a close
				}
				return conn.Close()
			})
		}},
		{"headers claiming huge sizes", func(ctx context.Context, a *attackEnv) (int, error) {
			hdr := func(h map[string]any) []byte {
				p := pack(h)
				return append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...)
			}
			cases := [][]byte{
				binary.BigEndian.AppendUint32(nil, 0xFFFFFFFF),
				binary.BigEndian.AppendUint32(nil, 1<<16+1),
				binary.BigEndian.AppendUint32(nil, 0),
				hdr(map[string]any{"method": rpc.MethodDescribe, "timeout_us": 0, "arg_len": int64(1) << 40, "body_len": 0}),
				hdr(map[string]any{"method": rpc.MethodFill, "timeout_us": 0, "arg_len": 10, "body_len": int64(1) << 62}),
			}
			for i, msg := range cases {
				s, err := session(ctx, a.addr, a.token, nil)
				if err != nil {
					return i, err
				}
				// A write may fail: the node may hang up as soon as it has
				// read the first bytes. What must not happen is that it
				// keeps the session.
				if st, err := s.OpenStream(); err == nil {
					st.Write(msg)
				}
				select {
				case <-s.CloseChan():
				case <-time.After(30 * time.Second):
					s.Close()
					return i, fmt.Errorf("the node kept serving a peer that sent % x", msg[:min(len(msg), 16)])
				}
				s.Close()
			}
			// A yamux frame claiming 4 GB, under the session layer.
			conn, err := authenticated(ctx, a.addr, a.token, nil)
			if err != nil {
				return len(cases), err
			}
			defer conn.Close()
			frame := []byte{0, 0, 0, 1, 0, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF} // data, SYN, stream 1, length 2^32-1
			conn.Write(frame)
			if !closedWithin(conn, 30*time.Second) {
				return len(cases) + 1, errors.New("the node kept a session whose frame claimed 4 GB")
			}
			return len(cases) + 1, nil
		}},
		{"references escaping the root", func(ctx context.Context, a *attackEnv) (int, error) {
			s, err := session(ctx, a.addr, a.token, a.fsid)
			if err != nil {
				return 0, err
			}
			defer s.Close()
			rel, _ := filepath.Rel(a.shared, a.outside)
			paths := []string{rel, a.outside, "honest/../../" + filepath.Base(a.outside), "link-out",
				"dir-out/" + filepath.Base(a.outside), ".tensorwire-fsid", "fsid-link", "honest/td/x.memmap\x00", `..\..\x`,
				strings.Repeat("a/", 3000) + "x"}
			for i, p := range paths {
				code, msg, err := call(s, rpc.MethodFill, refFill(p, 16), nil)
				if err != nil {
					return i, fmt.Errorf("a fill of %q broke the session: %w", p, err)
				}
				switch rpc.Code(code) {
				case rpc.PermissionDenied, rpc.InvalidArgument, rpc.NotFound:
				default:
					return i, fmt.Errorf("a fill by reference to %q: code %v %q, want a refusal", p, rpc.Code(code), msg)
				}
			}
			// The session still serves a good call after the refusals.
			if code, msg, err := call(s, rpc.MethodDescribe, map[string]any{"prefix": "honest"}, nil); err != nil || code != 0 {
				return len(paths), fmt.Errorf("describe after the refusals: code %d %q, %v", code, msg, err)
			}
			return len(paths), nil
		}},
		{"no token or a wrong one", func(ctx context.Context, a *attackEnv) (int, error) {
			return parallel(ctx, 100, 8, func(i int) error {
				if i%4 == 3 {
					c, err := rpc.Dial(ctx, a.addr, rpc.WithToken([]byte("guess")))
					if err == nil {
						c.Close()
						return errors.New("a client with a wrong token was let in")
					}
					if !errors.Is(err, rpc.ErrUnauthenticated) {
						return fmt.Errorf("a wrong token: %v, want Unauthenticated", err)
					}
					return nil
				}
				conn, err := net.Dial("tcp", a.addr)
				if err != nil {
					return err
				}
				defer conn.Close()
				var tok []byte
				if i%2 == 1 {
					tok = randBytes(32)
				}
				code, _, err := handshake(conn, tok, nil)
				if err != nil && tok != nil {
					return nil // a wrong proof may simply be hung up on
				}
				if code != int(rpc.Unauthenticated) {
					return fmt.Errorf("a handshake with token %x: code %d, %v; want Unauthenticated", tok, code, err)
				}
				return nil
			})
		}},
	}
}

// slowloris opens n connections that send a hello one byte a second and
// returns the longest the node let one live; it fails if the node waits
// for a whole hello at that pace.
func slowloris(ctx context.Context, addr string, n int) (time.Duration, error) {
	var longest atomic.Int64
	_, err := parallel(ctx, n, n, func(int) error {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		start := time.Now()
		h := hello(true, nil)
		for i := range h {
			if _, err := conn.Write(h[i : i+1]); err != nil {
				break
			}
			if closedWithin(conn, time.Second) {
				break
			}
			if i == len(h)-1 {
				return errors.New("the node read a whole hello at one byte a second")
			}
		}
		if d := int64(time.Since(start)); d > longest.Load() {
			longest.Store(d)
		}
		return nil
	})
	return time.Duration(longest.Load()), err
}

// parallel runs f(0..n-1) on workers goroutines and returns how many ran
// and the first error.
func parallel(ctx context.Context, n, workers int, f func(i int) error) (int, error) {
	var next atomic.Int64
	var done atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(done.Load()), first
}

// Hostile peers against a node on its own host, while an honest client
// calls it without pause: random bytes, one byte a second, thousands of
// connections opened and dropped, headers and frames claiming huge sizes,
// references out of the root, no token or a wrong one. The honest client
// is served throughout, nothing outside the root changes, and afterwards
// the node's connections, goroutines, open files and heap return to their
// baseline.
func TestHostilePeers(t *testing.T) {
	c := newCluster(t)
	h := c.host("node")
	// What the attacks aim at: a TensorDict in the root, a file and a
	// folder outside it, and symlinks from the root to them and to the
	// root's identity file.
	td, err := tensordict.Create(filepath.Join(c.shared, "honest"), []int{16},
		tensordict.Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{16}})
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	outDir := t.TempDir()
	outside := filepath.Join(outDir, "outside.memmap")
	if err := os.WriteFile(outside, make([]byte, 16), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"link-out": outside, "dir-out": outDir} {
		if err := os.Symlink(target, filepath.Join(c.shared, link)); err != nil {
			t.Fatal(err)
		}
	}
	node := c.node(h, "")
	if err := os.Symlink(filepath.Join(c.shared, rpc.FSIDFile), filepath.Join(c.shared, "fsid-link")); err != nil {
		t.Fatal(err)
	}
	token, err := nodeproc.ReadToken(c.token)
	if err != nil {
		t.Fatal(err)
	}
	fsidHex, err := os.ReadFile(filepath.Join(c.shared, rpc.FSIDFile))
	if err != nil {
		t.Fatal(err)
	}
	fsid, err := hex.DecodeString(strings.TrimSpace(string(fsidHex)))
	if err != nil {
		t.Fatal(err)
	}
	env := &attackEnv{addr: addr(h), token: token, fsid: fsid, shared: c.shared, outside: outside}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hc, err := rpc.Dial(ctx, env.addr, rpc.WithRoot(c.shared), rpc.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	good := &honest{c: hc}
	hctx, stopHonest := context.WithCancel(ctx)
	var honestDone sync.WaitGroup
	for range 2 {
		honestDone.Add(1)
		go func() { defer honestDone.Done(); good.run(hctx, "honest") }()
	}
	time.Sleep(500 * time.Millisecond)
	base, err := hc.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("baseline: %+v", base)

	tried := map[string]int{}
	var slowest time.Duration
	for range load.HostileRuns {
		slow := make(chan error, 1)
		go func() {
			d, err := slowloris(ctx, env.addr, 64)
			if d > slowest {
				slowest = d
			}
			slow <- err
		}()
		for _, a := range attacks() {
			n, err := a.run(ctx, env)
			tried[a.name] += n
			if err != nil {
				t.Errorf("%s: %v", a.name, err)
			}
		}
		if err := <-slow; err != nil {
			t.Errorf("slow sender: %v", err)
		}
		tried["slow senders, one byte a second"] += 64
	}
	stopHonest()
	honestDone.Wait()

	if b, _ := os.ReadFile(outside); string(b) != string(make([]byte, 16)) {
		t.Errorf("the file outside the root changed: % x", b)
	}
	if f := good.fails.Load(); f > 0 || good.calls.Load() == 0 {
		t.Errorf("the honest client: %d of %d calls failed: %v", f, good.calls.Load(), good.errs[:min(len(good.errs), 5)])
	}
	if !node.Alive() {
		t.Fatal("the node died")
	}
	// Back to the baseline: everything the attackers opened is gone.
	var after rpc.Stats
	deadline := time.Now().Add(30 * time.Second)
	for {
		if after, err = hc.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		if after.Handshakes == 0 && after.Peers == base.Peers && after.Goroutines <= base.Goroutines+4 &&
			after.OpenFiles <= base.OpenFiles+2 && after.HeapBytes <= base.HeapBytes+16<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not return to its baseline:\n before %+v\n after  %+v", base, after)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("after: %+v", after)
	var total int
	var kinds []string
	for k, n := range tried {
		total += n
		kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
	}
	t.Logf("tried: %s", strings.Join(kinds, "; "))
	figures(t, "load", load.Name, "rounds", load.HostileRuns, "hostile_attempts", total, "honest_calls", good.calls.Load(),
		"honest_failed", good.fails.Load(), "honest_slowest", time.Duration(good.slow.Load()).Round(time.Millisecond),
		"slow_sender_cut_after", slowest.Round(time.Millisecond), "node_heap_max_mb", fmt.Sprintf("%.1f", float64(good.heap.Load())/1e6),
		"goroutines_before_after", fmt.Sprintf("%d/%d", base.Goroutines, after.Goroutines),
		"heap_mb_before_after", fmt.Sprintf("%.1f/%.1f", float64(base.HeapBytes)/1e6, float64(after.HeapBytes)/1e6))
}
