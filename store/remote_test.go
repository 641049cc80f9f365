package store

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// node is a store served by an rpc.Server in this process.
type node struct {
	addr string
	s    *Store
	srv  *rpc.Server
}

// serveStore opens the store root/name and serves it as name on a new
// server with root as its shared root.
func serveStore(t testing.TB, root, name string, o Options) *node {
	t.Helper()
	s := openT(t, filepath.Join(root, name), o)
	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := Register(srv)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Add(name, s); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &node{addr: l.Addr().String(), s: s, srv: srv}
}

// dialT dials the store in mode "ref" or "bytes" and checks the mode.
func dialT(t testing.TB, addr, name, root, mode string) *Client {
	t.Helper()
	opts := []DialOption{WithRoot(root)}
	if mode == "bytes" {
		opts = append(opts, WithBytes())
	}
	c, err := Dial(ctxT(t), addr, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if got := c.SharedFS(); got != (mode == "ref") {
		t.Fatalf("SharedFS %v, want mode %s", got, mode)
	}
	return c
}

var modes = []string{"ref", "bytes"}

func TestClient_Semantics(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxT(t)
			root := t.TempDir()
			n := serveStore(t, root, "st", Options{InlineBytes: 512})
			c := dialT(t, n.addr, "st", root, mode)
			// Small items inline, large ones as prefixes.
			for i, size := range []int{4, 1000, 8, 2000} {
				if _, err := c.Append(ctx, "b", itemTD(t, int64(i), size)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.Put(ctx, "p", itemTD(t, 9, 3000)); err != nil {
				t.Fatal(err)
			}
			counts, rev, err := c.List(ctx)
			if err != nil || rev != 5 || counts["b"] != 4 || counts["p"] != 1 {
				t.Fatalf("List = %v at %d, %v", counts, rev, err)
			}
			peek, err := c.Peek(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(t, peek); !slices.Equal(g, []int64{0, 1, 2, 3}) {
				t.Fatalf("Peek = %v", g)
			}
			got, err := c.Get(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			if mode == "ref" {
				if x, _ := got[1].Tensor("x"); !x.Mapped() {
					t.Error("a large item by reference is not a mapping")
				}
			}
			if g := ids(t, got); !slices.Equal(g, []int64{0, 1, 2, 3}) {
				t.Fatalf("Get = %v", g)
			}
			if got, err := c.Get(ctx, "b"); err != nil || len(got) != 0 {
				t.Fatalf("second Get: %d items, %v", len(got), err)
			}
			if _, err := c.Delete(ctx, "p"); err != nil {
				t.Fatal(err)
			}
			if counts, _, _ := c.List(ctx); len(counts) != 0 {
				t.Fatalf("List after Get and Delete = %v", counts)
			}
			vals, _ := os.ReadDir(filepath.Join(n.s.Dir(), valuesDir))
			staged, _ := os.ReadDir(filepath.Join(n.s.Dir(), stagingDir))
			if len(vals) != 0 || len(staged) != 0 {
				t.Fatalf("%d values and %d staged prefixes left", len(vals), len(staged))
			}
		})
	}
}

func TestClient_Errors(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{MaxValueBytes: 1000})
	if _, err := Dial(ctx, n.addr, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Dial of a store not served = %v, want ErrNotFound", err)
	}
	c := dialT(t, n.addr, "st", root, "ref")
	if _, err := c.Append(ctx, "a/b", itemTD(t, 1, 1)); !errors.Is(err, ErrName) {
		t.Errorf("Append to a/b = %v, want ErrName", err)
	}
	if _, err := c.Append(ctx, "b", itemTD(t, 1, 200)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Append of 1600 bytes = %v, want ErrTooLarge", err)
	}
	if _, err := c.Latest(ctx, "none"); !errors.Is(err, ErrNotFound) || !errors.Is(err, rpc.ErrNotFound) {
		t.Errorf("Latest of nothing = %v, want ErrNotFound", err)
	}
	// The node checks too: a raw call past the client's checks.
	_, err := rpc.Call[revResponse](ctx, c.rc, MethodAppend, putRequest{Store: "st", Bin: "..", Value: valueMsg{}})
	if !errors.Is(err, ErrName) {
		t.Errorf("raw append to .. = %v, want ErrName", err)
	}
	for _, staged := range []string{"../../etc", "staging/../../x", "values/0000000000000001", "staging/" + newStagedName()} {
		_, err := rpc.Call[revResponse](ctx, c.rc, MethodAppend, putRequest{Store: "st", Bin: "b", Value: valueMsg{Staged: staged}})
		if !errors.Is(err, ErrNotStaged) {
			t.Errorf("append of staged %q = %v, want ErrNotStaged", staged, err)
		}
	}
	// A staged folder that is not a TensorDict is refused and left alone.
	bad := filepath.Join(c.StagingDir(), newStagedName())
	os.MkdirAll(bad, 0o755)
	os.WriteFile(filepath.Join(bad, "meta.json"), []byte("{"), 0o644)
	_, err = rpc.Call[revResponse](ctx, c.rc, MethodAppend, putRequest{Store: "st", Bin: "b", Value: valueMsg{Staged: "staging/" + filepath.Base(bad)}})
	if !errors.Is(err, ErrFormat) {
		t.Errorf("append of a bad staged prefix = %v, want ErrFormat", err)
	}
	if _, err := os.Stat(filepath.Join(bad, "meta.json")); err != nil {
		t.Errorf("the refused prefix was touched: %v", err)
	}
	if st := n.s.Stats(); st.Revision != 0 {
		t.Errorf("revision %d after refused calls", st.Revision)
	}
}

func TestClient_ManyInFlight(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{})
	c := dialT(t, n.addr, "st", root, "bytes")
	const workers, each = 16, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if _, err := c.Append(ctx, "b", itemTD(t, int64(w*1000+i), 16)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// A Get waits for nothing: it drains while the appends go on.
	var got []int64
	for len(got) < workers*each {
		tds, err := c.Get(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(t, tds)...)
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	wg.Wait()
	slices.Sort(got)
	if len(slices.Compact(got)) != workers*each {
		t.Fatalf("drained %d distinct items of %d", len(slices.Compact(got)), workers*each)
	}
}

func TestClient_Params(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxT(t)
			root := t.TempDir()
			n := serveStore(t, root, "st", Options{LeaseTTL: time.Second})
			pub := dialT(t, n.addr, "st", root, mode)
			rd := dialT(t, n.addr, "st", root, mode)
			waiting := make(chan *Param, 1)
			go func() {
				p, err := rd.WaitNewer(ctx, "net", 0)
				if err != nil {
					t.Error(err)
				}
				waiting <- p
			}()
			if v, err := pub.Publish(ctx, "net", itemTD(t, 1, 5000)); err != nil || v != 1 {
				t.Fatalf("Publish = %d, %v", v, err)
			}
			p1 := <-waiting
			if p1 == nil || p1.Version != 1 || idOf(t, p1.TD) != 1 {
				t.Fatalf("WaitNewer = %+v", p1)
			}
			if x, _ := p1.TD.Tensor("x"); x.Mapped() != (mode == "ref") {
				t.Errorf("mapped %v in mode %s", x.Mapped(), mode)
			}
			pub.Publish(ctx, "net", itemTD(t, 2, 5000))
			if mode == "ref" {
				// Hold v1 through three renewals of its lease: it stays.
				expiry := func() time.Time {
					n.s.mu.Lock()
					defer n.s.mu.Unlock()
					for _, l := range n.s.leases {
						if l.v == 1 {
							return l.expires
						}
					}
					return time.Time{}
				}
				last, renewals := expiry(), 0
				for deadline := time.Now().Add(30 * time.Second); renewals < 3; time.Sleep(10 * time.Millisecond) {
					if e := expiry(); e.IsZero() {
						t.Fatal("v1's lease is gone while its reader holds it")
					} else if e.After(last) {
						last, renewals = e, renewals+1
					}
					if time.Now().After(deadline) {
						t.Fatal("the lease was not renewed")
					}
				}
				n.s.mu.Lock()
				kept := n.s.versionLocked("net", 1) != nil
				n.s.mu.Unlock()
				if !kept {
					t.Fatal("v1 was deleted while its reader renewed its lease")
				}
				if err := p1.Err(); err != nil {
					t.Fatal(err)
				}
			}
			idOf(t, p1.TD)
			p1.Close()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				n.s.mu.Lock()
				gone := n.s.versionLocked("net", 1) == nil
				n.s.mu.Unlock()
				if gone {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("v1 was never deleted after its reader closed it")
				}
			}
			p2, err := rd.Latest(ctx, "net")
			if err != nil || p2.Version != 2 || idOf(t, p2.TD) != 2 {
				t.Fatalf("Latest = %+v, %v", p2, err)
			}
			p2.Close()
		})
	}
}

func TestClient_Watch(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{})
	c := dialT(t, n.addr, "st", root, "bytes")
	w := dialT(t, n.addr, "st", root, "bytes")
	got := make(chan Event, 100)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for e, err := range w.Watch(wctx, "b", 0) {
			if err != nil {
				close(got)
				return
			}
			got <- e
		}
	}()
	c.Append(ctx, "b", itemTD(t, 1, 1))
	c.Append(ctx, "other", itemTD(t, 1, 1))
	c.Append(ctx, "b2", itemTD(t, 2, 1))
	c.Get(ctx, "b")
	want := []Event{{Revision: 1, Op: OpAppend, Name: "b", Items: 1}, {Revision: 3, Op: OpAppend, Name: "b2", Items: 1},
		{Revision: 4, Op: OpGet, Name: "b", Items: 0}}
	for _, we := range want {
		select {
		case e := <-got:
			if e != we {
				t.Fatalf("event %+v, want %+v", e, we)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no event")
		}
	}
}

// TestClient_WatchCompacted: a remote watch from a revision the node no
// longer keeps ends with ErrCompacted, through the stream; one from a kept
// revision gets exactly the events after it.
func TestClient_WatchCompacted(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{History: 5})
	c := dialT(t, n.addr, "st", root, "bytes")
	for id := range 20 {
		c.Append(ctx, "b", itemTD(t, int64(id), 1))
	}
	for _, err := range c.Watch(ctx, "", 1) {
		if !errors.Is(err, ErrCompacted) || !errors.Is(err, rpc.ErrOutOfRange) {
			t.Fatalf("remote watch from 1 = %v, want ErrCompacted", err)
		}
		break
	}
	var got []uint64
	for e, err := range c.Watch(ctx, "", 17) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Revision)
		if len(got) == 3 {
			break
		}
	}
	if !slices.Equal(got, []uint64{18, 19, 20}) {
		t.Fatalf("remote watch from 17 = %v", got)
	}
}

// TestClient_BytesPeekOfManyPrefixes: peeking hundreds of prefix values
// by bytes works, and the node closes their mappings once they have been
// unused for mappingIdle.
func TestClient_BytesPeekOfManyPrefixes(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{InlineBytes: 64})
	c := dialT(t, n.addr, "st", root, "bytes")
	const items = 300
	for id := range items {
		if _, err := c.Append(ctx, "b", itemTD(t, int64(id), 16)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Peek(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(ids(t, got)) != items {
		t.Fatalf("peeked %d items, want %d", len(got), items)
	}
	n.s.closeIdleMappings(time.Now().Add(mappingIdle+time.Second), mappingIdle)
	n.s.mu.Lock()
	open := len(n.s.maps)
	n.s.mu.Unlock()
	if open != 0 {
		t.Fatalf("%d prefixes still mapped after they idled out", open)
	}
}
