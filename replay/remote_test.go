package replay

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// node is a buffer served by an rpc.Server in this process.
type node struct {
	b    *Buffer
	s    *rpc.Server
	svc  *Service
	addr string
	done chan error
}

// serveBuffer creates a buffer at root/name, serves it on a new server
// with that root at addr ("" for any port), and stops both at the end of
// the test.
func serveBuffer(t testing.TB, root, name string, cfg Config) *node {
	t.Helper()
	b, err := Create(filepath.Join(root, name), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, root, name, b, "127.0.0.1:0")
}

func serve(t testing.TB, root, name string, b *Buffer, addr string) *node {
	t.Helper()
	s, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := Register(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Add(name, b); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{b: b, s: s, svc: svc, addr: l.Addr().String(), done: make(chan error, 1)}
	go func() { n.done <- s.Serve(l) }()
	t.Cleanup(n.stop)
	return n
}

// stop closes the server, then the buffer; it may be called again.
func (n *node) stop() {
	if n.s == nil {
		return
	}
	n.s.Close()
	<-n.done
	n.b.Close()
	n.s = nil
}

func dialBuffer(t testing.TB, addr, name, root, mode string, extra ...DialOption) *Client {
	t.Helper()
	opts := append([]DialOption{WithRoot(root)}, extra...)
	switch mode {
	case "bytes":
		opts = append(opts, WithBytes())
	case "ref+prefetch":
		opts, mode = append(opts, WithPrefetch()), "ref"
	}
	c, err := Dial(ctxT(t), addr, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c.SharedFS() != (mode == "ref") {
		t.Fatalf("SharedFS() = %v in mode %s", c.SharedFS(), mode)
	}
	return c
}

var modes = []string{"ref", "bytes"}

// sampleModes adds a trainer that prefetches, for tests of sampling.
var sampleModes = []string{"ref", "ref+prefetch", "bytes"}

func TestRemote_ExtendSampleLikeLocal(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 8})
			c := dialBuffer(t, n.addr, "buf", root, mode)
			if got := extend(t, c, seq(0, 6)...); !slices.Equal(got, seq(0, 6)) {
				t.Fatalf("first batch went to %v", got)
			}
			if got := extend(t, c, 6, 7, 8, 9); !slices.Equal(got, []int{6, 7, 0, 1}) {
				t.Fatalf("second batch went to %v", got)
			}
			td, info, err := c.Sample(ctxT(t), 500)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[int]bool{}
			for i, id := range rowIDs(t, td) {
				seen[id] = true
				if info.Indices[i] != id%8 {
					t.Fatalf("row %d holds %d at index %d", i, id, info.Indices[i])
				}
			}
			if want := map[int]bool{2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true}; !maps.Equal(seen, want) {
				t.Fatalf("sampled %v", seen)
			}
			// SampleInto a reused batch.
			if _, err := c.SampleInto(ctxT(t), td); err != nil {
				t.Fatal(err)
			}
			rowIDs(t, td)
			st, err := c.Stats(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if st.Size != 8 || st.Inserted != 10 || st.Sampled != 1000 || st.NodeHeap == 0 {
				t.Fatalf("stats %+v", st)
			}
			if n, err := c.UpdatePriority(ctxT(t), info, make([]float64, len(info.Indices))); err != nil || n != 500 {
				t.Fatalf("UpdatePriority: %d, %v", n, err)
			}
			if err := c.Checkpoint(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRemote_NoTransitionBytesByReference(t *testing.T) {
	const side, batch = 128, 32 // 16 KiB of obs per transition, 512 KiB a batch
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 64})
			p := proctest.StartProxy(t, n.addr)
			// Uncompressed: these rows would compress, and the test counts them.
			c := dialBuffer(t, p.Addr, "buf", root, mode, WithRPC(rpc.WithCompression(false)))
			td := transitionsSized(t, side, seq(0, batch)...)
			if _, err := c.Extend(ctxT(t), td); err != nil {
				t.Fatal(err)
			}
			got, _, err := c.Sample(ctxT(t), batch)
			if err != nil {
				t.Fatal(err)
			}
			rowIDs(t, got)
			c.Close() // flush the counts
			p.WaitIdle(t)
			moved := int64(batch * side * side)
			t.Logf("%s: %d bytes up, %d down, for %d bytes of rows each way", mode, p.Up.Load(), p.Down.Load(), moved)
			switch mode {
			case "ref":
				if p.Up.Load() > moved/20 || p.Down.Load() > moved/20 {
					t.Fatalf("by reference %d bytes went up and %d down, for %d bytes of rows", p.Up.Load(), p.Down.Load(), moved)
				}
			case "bytes":
				if p.Up.Load() < moved || p.Down.Load() < moved {
					t.Fatalf("by bytes only %d bytes went up and %d down, for %d bytes of rows", p.Up.Load(), p.Down.Load(), moved)
				}
			}
		})
	}
}

// TestRemote_TopK: a remote writer sends each transition's key, so a
// top-k buffer keeps the same transitions as a local one.
func TestRemote_TopK(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 3, Writer: TopK("reward")})
			c := dialBuffer(t, n.addr, "buf", root, mode)
			first := extend(t, c, 5, 1, 9)
			if idx := extend(t, c, 3, 0, 7); !slices.Equal(idx, []int{-1, -1, first[1]}) {
				t.Fatalf("the batch [3 0 7] went to %v, want [-1 -1 %d] (7 into the slot of 1)", idx, first[1])
			}
			td, _, err := c.Sample(ctxT(t), 100)
			if err != nil {
				t.Fatal(err)
			}
			got := map[int]bool{}
			for _, id := range rowIDs(t, td) {
				got[id] = true
			}
			if !maps.Equal(got, map[int]bool{5: true, 7: true, 9: true}) {
				t.Fatalf("buffer holds %v, want {5, 7, 9}", got)
			}
		})
	}
}

func TestRemote_Errors(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 4, Schema: testSchema})
			c := dialBuffer(t, n.addr, "buf", root, mode)
			extend(t, c, 1)
			before := storageBytes(t, n.b)

			_, err := c.Extend(ctxT(t), transitionsSized(t, 3, 2))
			if !errors.Is(err, ErrSchema) || !errors.Is(err, rpc.ErrInvalidArgument) {
				t.Fatalf("wrong shape: %v, want ErrSchema and InvalidArgument", err)
			}
			if !bytes.Equal(before, storageBytes(t, n.b)) {
				t.Fatal("a refused batch changed the storage")
			}
			if _, err := c.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{9}}, []float64{1}); !errors.Is(err, ErrSchema) {
				t.Fatalf("an index out of range: %v", err)
			}
			if _, _, err := c.Sample(ctxT(t), 1<<21); !errors.Is(err, ErrArgument) {
				t.Fatalf("a sample of 2M transitions: %v", err)
			}
			if _, err := Dial(ctxT(t), n.addr, "nope", WithRoot(root)); !errors.Is(err, ErrNotFound) || !errors.Is(err, rpc.ErrNotFound) {
				t.Fatalf("Dial of an unknown buffer: %v", err)
			}
		})
	}
}

func TestRemote_EmptySampleDeadlineExceeded(t *testing.T) {
	for _, mode := range sampleModes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 4, Schema: testSchema})
			c := dialBuffer(t, n.addr, "buf", root, mode)
			// start before the deadline is set: a goroutine preempted
			// between the two (CI saw 12 ms) would otherwise see the call
			// return "early" by as much.
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_, _, err := c.Sample(ctx, 2)
			if !errors.Is(err, rpc.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("sampling an empty buffer: %v, want DeadlineExceeded", err)
			}
			if d := time.Since(start); d < 100*time.Millisecond || d > 30*time.Second {
				t.Fatalf("returned after %v, for a 100 ms deadline", d)
			}
			// The node goes on serving.
			extend(t, c, 3)
			td, _, err := c.Sample(ctxT(t), 2)
			if err != nil {
				t.Fatal(err)
			}
			rowIDs(t, td)
		})
	}
}

// TestRemote_NodeRestart closes the node, reopens its buffer from the
// prefix and serves it again at the same address: the clients' calls in
// the gap wait for it, and every committed transition is still there.
func TestRemote_NodeRestart(t *testing.T) {
	for _, mode := range sampleModes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 16})
			c := dialBuffer(t, n.addr, "buf", root, mode)
			extend(t, c, seq(0, 10)...)
			n.stop()

			restarted := make(chan *node, 1)
			go func() {
				time.Sleep(200 * time.Millisecond)
				b, err := Open(filepath.Join(root, "buf"))
				if err != nil {
					t.Error(err)
					restarted <- nil
					return
				}
				restarted <- serve(t, root, "buf", b, n.addr)
			}()
			// This call starts while the node is down.
			if got := extend(t, c, 10, 11); !slices.Equal(got, []int{10, 11}) {
				t.Fatalf("after the restart the batch went to %v", got)
			}
			if <-restarted == nil {
				t.FailNow()
			}
			td, _, err := c.Sample(ctxT(t), 400)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[int]bool{}
			for _, id := range rowIDs(t, td) {
				seen[id] = true
			}
			if len(seen) != 12 {
				t.Fatalf("after the restart the buffer holds %v, want 0..11", seen)
			}
		})
	}
}

// TestCheckPicks: a client working by reference refuses picks that would
// index its mappings out of range, from the first call or a resample.
func TestCheckPicks(t *testing.T) {
	ok := SampleInfo{Indices: []int{0, 3}, IDs: []uint64{1, 1}, Weights: []float64{1, 1}}
	if err := checkPicks(ok, 2, 4); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []SampleInfo{
		{Indices: []int{0, 4}, IDs: []uint64{1, 1}, Weights: []float64{1, 1}},
		{Indices: []int{-1, 0}, IDs: []uint64{1, 1}, Weights: []float64{1, 1}},
		{Indices: []int{0}, IDs: []uint64{1}, Weights: []float64{1}},
		{Indices: []int{0, 1}, IDs: []uint64{1}, Weights: []float64{1, 1}},
		{Indices: []int{0, 1}, IDs: []uint64{1, 1}},
	} {
		if err := checkPicks(bad, 2, 4); err == nil {
			t.Errorf("checkPicks(%+v, 2, 4) passed", bad)
		}
	}
}

// TestClient_AnotherBufferDropsMappings: a view of another buffer under
// the name (created anew, its schema not known yet) drops the mappings of
// the old one, which would otherwise pass for the new one's once the ids
// matched; the next call maps the buffer served now.
func TestClient_AnotherBufferDropsMappings(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 8, Schema: testSchema})
	c := dialBuffer(t, n.addr, "buf", root, "ref")
	extend(t, c, 1)
	old, err := c.acquire()
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.newView(infoResponse{ID: "another", Capacity: 8, LeaseMS: 30_000})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.swap(v); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	refs := old.refs
	c.mu.Unlock()
	committed := state(old.slots.word(0)) == stateCommitted // mapped still: no fault
	c.release(old)
	if refs != 1 || !committed {
		t.Fatalf("the old view, still held by a call, has %d references; slot 0 committed: %v", refs, committed)
	}
	cur, _ := c.acquire()
	if cur.storage != nil || cur.slots != nil || cur.schema != nil {
		t.Fatalf("after a view of another buffer without a schema: storage %v, slots %v, schema %v; want none", cur.storage != nil, cur.slots != nil, cur.schema)
	}
	c.release(cur)
	if got := extend(t, c, 2); !slices.Equal(got, []int{1}) {
		t.Fatalf("the next batch went to %v", got)
	}
	cur, _ = c.acquire()
	if cur.storage == nil {
		t.Fatal("the next Extend did not map the buffer again")
	}
	c.release(cur)
	td, _, err := c.Sample(ctxT(t), 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range rowIDs(t, td) {
		if id != 1 && id != 2 {
			t.Fatalf("sampled %d", id)
		}
	}
}

// TestClient_CallsAfterClose: a closed Client's calls, Stats among them,
// fail with ErrClosed rather than Unavailable; and a buffer closed on the
// node answers Stats with ErrClosed too.
func TestClient_CallsAfterClose(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 8, Schema: testSchema})
	c := dialBuffer(t, n.addr, "buf", root, "ref")
	extend(t, c, 0, 1)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stats(ctxT(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Stats after Close: %v; want ErrClosed", err)
	}
	if err := c.Checkpoint(ctxT(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Checkpoint after Close: %v; want ErrClosed", err)
	}
	if _, err := c.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{0}}, []float64{1}); !errors.Is(err, ErrClosed) {
		t.Errorf("UpdatePriority after Close: %v; want ErrClosed", err)
	}

	other := dialBuffer(t, n.addr, "buf", root, "bytes")
	if err := n.b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.b.Stats(); !errors.Is(err, ErrClosed) {
		t.Errorf("Buffer.Stats after Close: %v; want ErrClosed", err)
	}
	if _, err := other.Stats(ctxT(t)); !errors.Is(err, ErrClosed) || !errors.Is(err, rpc.ErrFailedPrecondition) {
		t.Errorf("Stats of a buffer closed on the node: %v; want ErrClosed (FailedPrecondition)", err)
	}
}

// TestSampleInfo_IDsAreGenerations: SampleInfo.IDs are the generations of
// the slots sampled, as documented: how many times a writer has taken the
// slot; UpdatePriority updates a row only under that ID.
func TestSampleInfo_IDsAreGenerations(t *testing.T) {
	for _, mode := range append([]string{"local"}, modes...) {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 1, Schema: testSchema, Sampler: Prioritized(1, 1)})
			var buf interface {
				Extend(context.Context, *tensordict.TensorDict) ([]int, error)
				Sample(context.Context, int) (*tensordict.TensorDict, SampleInfo, error)
				UpdatePriority(context.Context, SampleInfo, []float64) (int, error)
			} = n.b
			if mode != "local" {
				buf = dialBuffer(t, n.addr, "buf", root, mode)
			}
			for id := range 3 {
				extend(t, buf, id) // slot 0, taken for the (id+1)th time
			}
			_, info, err := buf.Sample(ctxT(t), 2)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(info.IDs, []uint64{3, 3}) {
				t.Fatalf("IDs %v; want [3 3], slot 0's generation after three writes", info.IDs)
			}
			stale := SampleInfo{Indices: []int{0}, IDs: []uint64{2}}
			if got, err := buf.UpdatePriority(ctxT(t), stale, []float64{5}); got != 0 || err != nil {
				t.Errorf("UpdatePriority under generation 2: %d, %v; want 0 rows", got, err)
			}
			if got, err := buf.UpdatePriority(ctxT(t), info, []float64{5, 5}); got != 2 || err != nil {
				t.Errorf("UpdatePriority under the sampled IDs: %d, %v; want 2 rows", got, err)
			}
		})
	}
}

// TestSample_BatchSizeMustBePositive: a sample of no transitions, or of
// more than a call may return, is InvalidArgument saying so, not a schema
// mismatch.
func TestSample_BatchSizeMustBePositive(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 4, Schema: testSchema})
	extend(t, n.b, 0)
	for _, mode := range append([]string{"local"}, modes...) {
		var buf interface {
			Sample(context.Context, int) (*tensordict.TensorDict, SampleInfo, error)
		} = n.b
		if mode != "local" {
			buf = dialBuffer(t, n.addr, "buf", root, mode)
		}
		for _, tc := range []struct {
			n    int
			want string
		}{{0, "batch size must be positive, not 0"}, {-1, "batch size must be positive, not -1"}, {1 << 21, "at most"}} {
			_, _, err := buf.Sample(ctxT(t), tc.n)
			if !errors.Is(err, ErrArgument) || errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: Sample(%d): %v; want ErrArgument saying %q", mode, tc.n, err, tc.want)
			}
			if mode != "local" && !errors.Is(err, rpc.ErrInvalidArgument) {
				t.Errorf("%s: Sample(%d): %v; want InvalidArgument", mode, tc.n, err)
			}
		}
	}
}

// TestService_Remove: once a buffer is removed from the Service, calls for
// its name fail with ErrNotFound (NotFound on the wire), and so does a new
// Dial; the buffer itself stays open, and serving it again under the name
// brings the calls back. Removing a name not served does nothing.
func TestService_Remove(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 8, Schema: testSchema})
	for _, mode := range modes {
		c := dialBuffer(t, n.addr, "buf", root, mode)
		extend(t, c, 1)
	}
	c := dialBuffer(t, n.addr, "buf", root, "bytes")
	n.svc.Remove("buf")
	n.svc.Remove("never served")
	for name, call := range map[string]func() error{
		"Stats":      func() error { _, err := c.Stats(ctxT(t)); return err },
		"Extend":     func() error { _, err := c.Extend(ctxT(t), transitions(t, 2)); return err },
		"Sample":     func() error { _, _, err := c.Sample(ctxT(t), 1); return err },
		"Checkpoint": func() error { return c.Checkpoint(ctxT(t)) },
		"Dial": func() error {
			c, err := Dial(ctxT(t), n.addr, "buf")
			if err == nil {
				c.Close()
			}
			return err
		},
	} {
		if err := call(); !errors.Is(err, ErrNotFound) || !errors.Is(err, rpc.ErrNotFound) {
			t.Errorf("%s after Remove: %v; want ErrNotFound", name, err)
		}
	}
	if _, err := n.b.Stats(); err != nil {
		t.Errorf("the removed buffer: Stats %v; it stays open", err)
	}
	if err := n.svc.Add("buf", n.b); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stats(ctxT(t)); err != nil || st.Size != 2 {
		t.Errorf("Stats once served again: %+v, %v; want the 2 transitions", st, err)
	}
}

// TestRemote_SampleIntoBytesAllocatesNotTheBatch: by bytes, SampleInto
// reads the rows into dst as they arrive (rpc.CallInto), as its doc
// promises ("without allocating it"), and the node (in this process too)
// gathers them into a batch it sent before (sentBatches); Sample's new
// batch shows the measurement can tell.
func TestRemote_SampleIntoBytesAllocatesNotTheBatch(t *testing.T) {
	const side, batch = 128, 64 // 16 KiB of obs a transition, 1 MiB a batch
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 256})
	c := dialBuffer(t, n.addr, "buf", root, "bytes", WithRPC(rpc.WithCompression(false)))
	if _, err := c.Extend(ctxT(t), transitionsSized(t, side, seq(0, 256)...)); err != nil {
		t.Fatal(err)
	}
	dst, _, err := c.Sample(ctxT(t), batch)
	if err != nil {
		t.Fatal(err)
	}
	perCall := func(f func() error) uint64 {
		const calls = 8
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range calls {
			if err := f(); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&m1)
		return (m1.TotalAlloc - m0.TotalAlloc) / calls
	}
	into := perCall(func() error {
		_, err := c.SampleInto(ctxT(t), dst)
		return err
	})
	rowIDs(t, dst)
	fresh := perCall(func() error {
		_, _, err := c.Sample(ctxT(t), batch)
		return err
	})
	size := uint64(batch * side * side)
	if fresh < size {
		t.Fatalf("Sample allocated %d bytes a call, less than its %d-byte batch: the measurement cannot tell", fresh, size)
	}
	if into > size/8 {
		t.Errorf("SampleInto allocated %d bytes a call, node and client (Sample: %d), want well under the %d-byte batch", into, fresh, size)
	}
}
