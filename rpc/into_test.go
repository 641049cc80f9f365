package rpc

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// intoReq asks test.into for a response: TensorDicts like placeTD's of
// Rows rows and Width columns, with Seed; Random: "w" random (lz4 leaves
// it as it is) instead of patterned; Pick: send those rows of A only
// (gathered); Meta: A carries non-tensor data too; B: a second TD, of 3
// rows; Same: the same TensorDict every call (made at the first), so
// that the node allocates none.
type intoReq struct {
	Rows, Width int
	Seed        byte
	Random      bool
	Pick        []int
	Meta        bool
	B           bool
	Same        bool
}

type intoResp struct {
	N int
	A TD
	B *TD
}

// intoTD is the TensorDict test.into sends for r (A's, or with b B's).
func intoTD(t testing.TB, r intoReq, b bool) *tensordict.TensorDict {
	rows, seed := r.Rows, r.Seed
	if b {
		rows, seed = 3, r.Seed+100
	}
	td := placeTD(t.(*testing.T), rows, r.Width, seed)
	if r.Random && !b {
		v, _ := td.Tensor("w")
		bs, _ := v.Bytes()
		rng := rand.New(rand.NewPCG(uint64(r.Seed), 1))
		for i := range bs {
			bs[i] = byte(rng.Uint32())
		}
	}
	return td
}

func startIntoNode(t *testing.T) *Client {
	t.Helper()
	s, addr := startServer(t) // no root: every TD goes as bytes
	var mu sync.Mutex
	var same *tensordict.TensorDict
	must(t, Register(s, "test.into", func(ctx context.Context, r intoReq) (intoResp, error) {
		var td *tensordict.TensorDict
		if r.Same {
			mu.Lock()
			if same == nil {
				same = intoTD(t, r, false)
			}
			td = same
			mu.Unlock()
		} else {
			td = intoTD(t, r, false)
		}
		resp := intoResp{N: 7, A: TD{TensorDict: td, Rows: r.Pick}}
		if r.Meta {
			if err := resp.A.Set("meta", &tensordict.NonTensor{Data: "hello"}); err != nil {
				return intoResp{}, err
			}
		}
		if r.B {
			resp.B = &TD{TensorDict: intoTD(t, r, true)}
		}
		return resp, nil
	}))
	return dial(t, addr)
}

// layoutLike returns a zeroed TensorDict with placeTD's layout for rows
// and width, changed by change (nil: none), in Go memory or, with dir
// set, mapped from files under dir.
func layoutLike(t *testing.T, rows, width int, dir string, change func(*[]tensordict.Field, *[]int)) *tensordict.TensorDict {
	t.Helper()
	fields := []tensordict.Field{
		{Key: []string{"w"}, DType: memmap.Float32, Shape: []int{rows, width}},
		{Key: []string{"n", "b"}, DType: memmap.Int64, Shape: []int{rows}},
		{Key: []string{"e"}, DType: memmap.Uint8, Shape: []int{rows, 0}},
	}
	batch := []int{rows}
	if change != nil {
		change(&fields, &batch)
	}
	if dir != "" {
		td, err := tensordict.Create(filepath.Join(dir, "dst"), batch, fields...)
		must(t, err)
		t.Cleanup(func() { td.Close() })
		return td
	}
	td, err := tensordict.New(batch...)
	must(t, err)
	for _, f := range fields {
		x, err := tensordict.Zeros(f.DType, f.Shape...)
		must(t, err)
		must(t, td.SetPath(f.Key, x))
	}
	return td
}

func TestCallInto(t *testing.T) {
	c := startIntoNode(t)
	ctx := context.Background()
	same := func(*[]tensordict.Field, *[]int) {}
	for _, tc := range []struct {
		name   string
		req    intoReq
		mapped bool
		change func(*[]tensordict.Field, *[]int)
		fits   bool
	}{
		{name: "fits, lz4 body", req: intoReq{Rows: 4, Width: 1024, Seed: 1}, change: same, fits: true},
		{name: "fits, raw body", req: intoReq{Rows: 4, Width: 1024, Seed: 2, Random: true}, change: same, fits: true},
		{name: "fits, mapped", req: intoReq{Rows: 4, Width: 1024, Seed: 3}, mapped: true, change: same, fits: true},
		{name: "fits, mapped, raw body over a megabyte", req: intoReq{Rows: 300, Width: 1024, Seed: 4, Random: true}, mapped: true, change: same, fits: true},
		{name: "fits, gathered rows", req: intoReq{Rows: 6, Width: 16, Seed: 5, Pick: []int{4, 1}}, change: func(f *[]tensordict.Field, b *[]int) {
			*f = layoutLike(t, 2, 16, "", nil).Schema()
			*b = []int{2}
		}, fits: true},
		{name: "another dtype", req: intoReq{Rows: 4, Width: 16, Seed: 6}, change: func(f *[]tensordict.Field, _ *[]int) { (*f)[0].DType = memmap.Int32 }},
		{name: "another shape", req: intoReq{Rows: 4, Width: 16, Seed: 7}, change: func(f *[]tensordict.Field, _ *[]int) { (*f)[0].Shape = []int{4, 17} }},
		{name: "another batch size", req: intoReq{Rows: 4, Width: 16, Seed: 8}, change: func(_ *[]tensordict.Field, b *[]int) { *b = []int{} }},
		{name: "a key more", req: intoReq{Rows: 4, Width: 16, Seed: 9}, change: func(f *[]tensordict.Field, _ *[]int) {
			*f = append(*f, tensordict.Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{4}})
		}},
		{name: "a key less", req: intoReq{Rows: 4, Width: 16, Seed: 10}, change: func(f *[]tensordict.Field, _ *[]int) { *f = (*f)[:2] }},
		{name: "a key elsewhere", req: intoReq{Rows: 4, Width: 16, Seed: 11}, change: func(f *[]tensordict.Field, _ *[]int) { (*f)[1].Key = []string{"b"} }},
		{name: "non-tensor data", req: intoReq{Rows: 4, Width: 16, Seed: 12, Meta: true}, change: same},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := ""
			if tc.mapped {
				dir = t.TempDir()
			}
			rows, width := tc.req.Rows, tc.req.Width
			dst := layoutLike(t, rows, width, dir, tc.change)
			before, err := dst.Clone()
			must(t, err)
			resp, err := CallInto[intoResp](ctx, c, "test.into", tc.req, dst)
			if err != nil {
				t.Fatal(err)
			}
			want := intoTD(t, tc.req, false)
			if tc.req.Pick != nil {
				want, err = want.Gather(tc.req.Pick)
				must(t, err)
			}
			if resp.N != 7 {
				t.Errorf("N = %d, want 7", resp.N)
			}
			if got := resp.A.TensorDict == dst; got != tc.fits {
				t.Fatalf("the response's TD is dst: %v, want %v", got, tc.fits)
			}
			if tc.req.Meta {
				must(t, want.Set("meta", &tensordict.NonTensor{Data: "hello"}))
			}
			if !resp.A.Equal(want) {
				t.Errorf("the response's TD is not what the node sent")
			}
			if tc.req.Pick != nil && (len(resp.A.Rows) != 2 || resp.A.Rows[0] != 0 || resp.A.Rows[1] != 1) {
				t.Errorf("Rows = %v, want [0 1] as Call gives them", resp.A.Rows)
			}
			if !tc.fits && !dst.Equal(before) {
				t.Errorf("dst was written, though the response's TD did not fit it")
			}
			if tc.mapped {
				// The bytes are in the files, not only in this mapping.
				must(t, dst.Close())
				back, err := tensordict.LoadMemmap(filepath.Join(dir, "dst"))
				must(t, err)
				defer back.Close()
				if !back.Equal(want) {
					t.Errorf("the files read back differ from what the node sent")
				}
			}
		})
	}
}

// TestCallInto_UnwritableDestination: a mapped destination that cannot be
// written (here its files were truncated under it) fails the call with
// Internal, the code of a response the caller could not take, and the
// cause (memmap.ErrFault); the connection is in step and serves the next
// call. It failed before: the caller's own failure came back as
// Unavailable, the code of a connection that broke.
func TestCallInto_UnwritableDestination(t *testing.T) {
	c := startIntoNode(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	req := intoReq{Rows: 4, Width: 1024, Seed: 30, Random: true}
	dst := layoutLike(t, req.Rows, req.Width, dir, nil)
	files, err := filepath.Glob(filepath.Join(dir, "dst", "*.memmap"))
	must(t, err)
	if len(files) == 0 {
		t.Fatal("no tensor files under the destination")
	}
	for _, f := range files {
		must(t, os.Truncate(f, 0))
	}
	_, err = CallInto[intoResp](ctx, c, "test.into", req, dst)
	if !errors.Is(err, ErrInternal) || !errors.Is(err, memmap.ErrFault) {
		t.Fatalf("CallInto into a truncated destination: %v, want Internal wrapping memmap.ErrFault", err)
	}
	resp, err := CallInto[intoResp](ctx, c, "test.into", req, layoutLike(t, req.Rows, req.Width, "", nil))
	if err != nil || resp.N != 7 {
		t.Fatalf("the next call: %+v, %v", resp, err)
	}
}

// TestCallInto_Several: into[i] is for the response's i-th TD; a nil
// into[i] takes none, and TDs past into are made as Call makes them.
func TestCallInto_Several(t *testing.T) {
	c := startIntoNode(t)
	req := intoReq{Rows: 4, Width: 16, Seed: 20, B: true}
	a, b := layoutLike(t, 4, 16, "", nil), layoutLike(t, 3, 16, "", nil)
	for _, tc := range []struct {
		name         string
		into         []*tensordict.TensorDict
		wantA, wantB *tensordict.TensorDict // the TensorDicts the response should hold; nil: new ones
	}{
		{"both", []*tensordict.TensorDict{a, b}, a, b},
		{"the second", []*tensordict.TensorDict{nil, b}, nil, b},
		{"the first", []*tensordict.TensorDict{a}, a, nil},
		{"swapped: neither fits", []*tensordict.TensorDict{b, a}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := CallInto[intoResp](context.Background(), c, "test.into", req, tc.into...)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range []struct {
				got, want, sent *tensordict.TensorDict
			}{{resp.A.TensorDict, tc.wantA, intoTD(t, req, false)}, {resp.B.TensorDict, tc.wantB, intoTD(t, req, true)}} {
				if (g.want != nil && g.got != g.want) || (g.want == nil && (g.got == a || g.got == b)) {
					t.Errorf("a TD was read into the wrong TensorDict")
				}
				if !g.got.Equal(g.sent) {
					t.Errorf("a TD is not what the node sent")
				}
			}
		})
	}
}

// TestCallInto_AllocatesNotTheTensors: a loop of CallInto of a 4 MiB
// TensorDict allocates far less than the tensor a call (Call's does
// allocate it: the measurement can tell).
func TestCallInto_AllocatesNotTheTensors(t *testing.T) {
	c := startIntoNode(t)
	ctx := context.Background()
	req := intoReq{Rows: 1024, Width: 1024, Seed: 30, Random: true, Same: true}
	dst := layoutLike(t, 1024, 1024, "", nil)
	perCall := func(f func() error) uint64 {
		const calls = 8
		must(t, f()) // warm: the connections, the pools
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range calls {
			must(t, f())
		}
		runtime.ReadMemStats(&m1)
		return (m1.TotalAlloc - m0.TotalAlloc) / calls
	}
	into := perCall(func() error {
		resp, err := CallInto[intoResp](ctx, c, "test.into", req, dst)
		if err == nil && resp.A.TensorDict != dst {
			t.Fatal("the response's TD did not fit dst")
		}
		return err
	})
	call := perCall(func() error {
		_, err := Call[intoResp](ctx, c, "test.into", req)
		return err
	})
	const size = 4 << 20
	if call < size {
		t.Fatalf("Call allocated %d bytes a call, less than the %d-byte tensor: the measurement cannot tell", call, size)
	}
	if into > size/8 {
		t.Errorf("CallInto allocated %d bytes a call (Call: %d), want well under the %d-byte tensor", into, call, size)
	}
}

// TestWireFits covers what a well-behaved node does not send: a key twice
// (which would leave an item of dst unwritten) and a tensor by reference.
func TestWireFits(t *testing.T) {
	dst := layoutLike(t, 4, 16, "", nil)
	base := func() *wireTD {
		return &wireTD{Batch: []int{4}, Entries: []wireEntry{
			{Key: []string{"w"}, Kind: kindTensor, DType: "torch.float32", Shape: []int{4, 16}},
			{Key: []string{"n"}, Kind: kindDict, Shape: []int{4}},
			{Key: []string{"n", "b"}, Kind: kindTensor, DType: "torch.int64", Shape: []int{4}},
			{Key: []string{"e"}, Kind: kindTensor, DType: "torch.uint8", Shape: []int{4, 0}},
		}}
	}
	if !base().fits(dst) {
		t.Fatal("the wire form of dst's own layout does not fit it")
	}
	twice := base()
	twice.Entries[3] = twice.Entries[0]
	ref := base()
	ref.Entries[0].Ref = &wireRef{Path: "x", File: []int{4, 16}}
	nested := base()
	nested.Entries[1].Shape = []int{}
	for name, w := range map[string]*wireTD{"a key twice": twice, "by reference": ref, "nested batch": nested, "nil": nil} {
		if w.fits(dst) {
			t.Errorf("%s: fits", name)
		}
	}
}

// TestTD_Release: a response TD's Release runs once, after its bytes are
// on their way: the handler's Release zeroes the tensors, and the caller
// still gets what the handler returned. It runs when the handler fails
// too.
func TestTD_Release(t *testing.T) {
	s, addr := startServer(t)
	released := make(chan struct{}, 4)
	must(t, Register(s, "test.release", func(ctx context.Context, r intoReq) (intoResp, error) {
		td := intoTD(t, r, false)
		resp := intoResp{A: TD{TensorDict: td, Release: func() {
			for _, x := range td.Leaves() {
				b, _ := x.Bytes()
				clear(b)
			}
			released <- struct{}{}
		}}}
		if r.Meta {
			return resp, Errorf(FailedPrecondition, "no")
		}
		return resp, nil
	}))
	c := dial(t, addr)
	for _, tc := range []struct {
		name string
		req  intoReq
	}{
		{"small, on a stream", intoReq{Rows: 4, Width: 16, Seed: 1}},
		{"large, on a side connection, raw", intoReq{Rows: 300, Width: 1024, Seed: 2, Random: true}},
		{"large, lz4", intoReq{Rows: 300, Width: 1024, Seed: 3}},
		{"the handler fails", intoReq{Rows: 4, Width: 16, Seed: 4, Meta: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := Call[intoResp](context.Background(), c, "test.release", tc.req)
			if tc.req.Meta {
				if err == nil {
					t.Fatal("the call succeeded")
				}
			} else if err != nil {
				t.Fatal(err)
			} else if !resp.A.Equal(intoTD(t, tc.req, false)) {
				t.Error("the caller got what Release left, not what the handler returned")
			}
			select {
			case <-released:
			case <-time.After(10 * time.Second):
				t.Fatal("Release was not called")
			}
			select {
			case <-released:
				t.Fatal("Release was called twice")
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}

// TestTD_Release_CallerGone: a caller that goes away while a large
// response is on its way (its connection closed mid-body) still gets the
// handler's Release called, once: a node's pool of batches loses none to
// a trainer killed mid-sample.
func TestTD_Release_CallerGone(t *testing.T) {
	s, addr := startServer(t)
	released := make(chan struct{}, 4)
	started := make(chan struct{}, 1)
	must(t, Register(s, "test.release", func(ctx context.Context, r intoReq) (intoResp, error) {
		td := intoTD(t, r, false)
		started <- struct{}{}
		return intoResp{A: TD{TensorDict: td, Release: func() { released <- struct{}{} }}}, nil
	}))
	c := dial(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// 64 MiB of random rows: far more than the sockets hold, so the
		// node is still writing when the caller goes.
		_, err := Call[intoResp](ctx, c, "test.release", intoReq{Rows: 16 << 10, Width: 1024, Seed: 9, Random: true})
		done <- err
	}()
	<-started
	cancel()
	c.Close()
	if err := <-done; err == nil {
		t.Fatal("the call succeeded though its caller went away")
	}
	select {
	case <-released:
	case <-time.After(30 * time.Second):
		t.Fatal("Release was not called once the caller went away")
	}
	select {
	case <-released:
		t.Fatal("Release was called twice")
	case <-time.After(100 * time.Millisecond):
	}
}

// TestTD_ReleasePanics: a Release that panics is the handler's bug, not
// the node's end: it is logged, the caller has its answer, and the
// connection and the node go on serving.
func TestTD_ReleasePanics(t *testing.T) {
	s, addr := startServer(t)
	must(t, Register(s, "test.release", func(ctx context.Context, r intoReq) (intoResp, error) {
		return intoResp{N: 7, A: TD{TensorDict: intoTD(t, r, false), Release: func() { panic("a handler's bug") }}}, nil
	}))
	c := dial(t, addr)
	for i := range 3 {
		resp, err := Call[intoResp](context.Background(), c, "test.release", intoReq{Rows: 4, Width: 16, Seed: byte(i)})
		if err != nil || resp.N != 7 || !resp.A.Equal(intoTD(t, intoReq{Rows: 4, Width: 16, Seed: byte(i)}, false)) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
