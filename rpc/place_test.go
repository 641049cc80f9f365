package rpc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// placeTD returns a TensorDict of batch [rows] with a float32 "w" of
// rows x width (patterned, so that lz4 compresses it, unless random), a
// nested "n"/"b" of int64 [rows] and an empty "e".
func placeTD(t *testing.T, rows, width int, seed byte) *tensordict.TensorDict {
	t.Helper()
	td, err := tensordict.New(rows)
	must(t, err)
	w, err := tensordict.Zeros(memmap.Float32, rows, width)
	must(t, err)
	b, _ := w.Bytes()
	for i := range b {
		b[i] = byte(i/4096) + seed
	}
	nb, err := tensordict.Zeros(memmap.Int64, rows)
	must(t, err)
	b, _ = nb.Bytes()
	for i := range b {
		b[i] = byte(i) ^ seed
	}
	e, err := tensordict.Zeros(memmap.Uint8, rows, 0)
	must(t, err)
	must(t, td.Set("w", w))
	must(t, td.SetPath([]string{"n", "b"}, nb))
	must(t, td.Set("e", e))
	return td
}

// placeNode serves test.place, whose handler reports what it got and does
// what the request's S says with a placed folder (keep: rename it to
// N's folder under dir), with PlaceBytes putting TDs where where says.
type placeNode struct {
	*testNode
	dir    string
	places atomic.Int32 // PlaceBytes's function ran
	got    chan placeGot
}

type placeGot struct {
	prefix string // the TD's Prefix
	mapped bool   // its tensors are mappings
	td     *tensordict.TensorDict
	rows   []int
}

func startPlaceNode(t *testing.T, where func(req *sinkReq, l Layout) (Placement, error), opts ...Option) *placeNode {
	t.Helper()
	n := &placeNode{testNode: startTestNode(t, opts...), dir: t.TempDir(), got: make(chan placeGot, 16)}
	must(t, Register(n.s, "test.place", func(ctx context.Context, req sinkReq) (echoMsg, error) {
		g := placeGot{prefix: req.X.Prefix(), mapped: firstLeaf(t, req.X.TensorDict).Mapped(), rows: req.X.Rows}
		var err error
		if g.td, err = req.X.Clone(); err != nil {
			return echoMsg{}, err
		}
		n.got <- g
		if req.S == "keep" && g.prefix != "" {
			if err := os.Rename(g.prefix, filepath.Join(n.dir, "kept")); err != nil {
				return echoMsg{}, err
			}
		}
		return echoMsg{N: req.N}, nil
	}, PlaceBytes(func(req *sinkReq, td *TD, l Layout) (Placement, error) {
		n.places.Add(1)
		if td != &req.X {
			t.Errorf("PlaceBytes was given %p, not the request's TD %p", td, &req.X)
		}
		return where(req, l)
	})))
	return n
}

// waitGone waits until nothing is at path.
func waitGone(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there after the call (%v)", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPlaceBytes: a TD sent as bytes to a method registered with
// PlaceBytes is laid out in the folder its function names, filled as it
// arrives, and given to the handler mapped from there, equal to what was
// sent: whole, compressed or not, in megabyte chunks or less, or some rows
// of it. The folder is the handler's to keep by moving it; left where it
// is, it is removed as the call ends. A TD whose layout Create cannot
// make, or for which the function says no, or whose folder cannot be
// made, is built in memory as before.
func TestPlaceBytes(t *testing.T) {
	var next atomic.Int32
	var base string
	n := startPlaceNode(t, func(req *sinkReq, l Layout) (Placement, error) {
		switch req.S {
		case "memory":
			return Placement{}, nil
		case "unmakeable":
			return Placement{Prefix: filepath.Join(base, "a-file", "p")}, nil
		}
		return Placement{Prefix: filepath.Join(base, "p", string(rune('a'+next.Add(1)))), Writeback: req.N%2 == 0}, nil
	})
	base = n.dir
	must(t, os.WriteFile(filepath.Join(base, "a-file"), nil, 0o644))
	must(t, os.Mkdir(filepath.Join(base, "p"), 0o755))
	c := dial(t, n.addr)

	nonTensor := placeTD(t, 4, 8, 1)
	must(t, nonTensor.Set("note", &tensordict.NonTensor{Data: "hi"}))
	otherBatch := placeTD(t, 4, 8, 2)
	sub, err := tensordict.New(4, 2)
	must(t, err)
	x, err := tensordict.Zeros(memmap.Uint8, 4, 2, 3)
	must(t, err)
	must(t, sub.Set("x", x))
	must(t, otherBatch.Set("s", sub))

	big := placeTD(t, 8, (3<<20+100)/4/8, 3) // 3 MiB and a bit: four chunks
	for _, tc := range []struct {
		name     string
		s        string
		td       TD
		compress bool
		placed   bool // the handler got it mapped from a placed folder
		calls    int32
	}{
		{"small, kept", "keep", Ref(placeTD(t, 4, 8, 4)), false, true, 1},
		{"megabytes, left", "left", Ref(big), false, true, 1},
		{"megabytes, compressed, kept", "keep", Ref(big), true, true, 1},
		{"some rows", "left", TD{TensorDict: big, Rows: []int{7, 0, 3}}, false, true, 1},
		{"non-tensor data", "left", Ref(nonTensor), false, false, 0},
		{"a nested batch of its own", "left", Ref(otherBatch), false, false, 0},
		{"the function says no", "memory", Ref(big), false, false, 1},
		{"the folder cannot be made", "unmakeable", Ref(big), false, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.RemoveAll(filepath.Join(base, "kept"))
			before := n.places.Load()
			ctx := testCtx(t)
			if !tc.compress {
				ctx = Uncompressed(ctx)
			}
			_, err := Call[echoMsg](ctx, c, "test.place", sinkReq{X: tc.td, S: tc.s, N: int(next.Load())})
			must(t, err)
			g := <-n.got
			if got := n.places.Load() - before; got != tc.calls {
				t.Errorf("PlaceBytes's function ran %d times, want %d", got, tc.calls)
			}
			if (g.prefix != "") != tc.placed || g.mapped != tc.placed {
				t.Fatalf("the handler got a TD at %q (mapped %v); want placed %v", g.prefix, g.mapped, tc.placed)
			}
			want := tc.td.TensorDict
			if tc.td.Rows != nil {
				want, err = want.Gather(tc.td.Rows)
				must(t, err)
				if len(g.rows) != 3 || g.rows[0] != 0 || g.rows[2] != 2 {
					t.Errorf("rows %v, want 0, 1, 2", g.rows)
				}
			}
			if !g.td.Equal(want) {
				t.Fatalf("the handler got %v, want %v", g.td, want)
			}
			if !tc.placed {
				return
			}
			waitGone(t, g.prefix)
			if tc.s != "keep" {
				return
			}
			kept, err := tensordict.LoadMemmap(filepath.Join(base, "kept"))
			must(t, err)
			defer kept.Close()
			if !kept.Equal(want) {
				t.Fatalf("the kept folder holds %v, want %v", kept, want)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(base, "a-file")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(base, "p")); len(ents) != 0 {
		t.Fatalf("folders left behind: %v", ents)
	}
	echo(t, c)
}

// TestPlaceBytes_Refused: an error from PlaceBytes's function is the
// call's, with its code, and the handler does not run; a folder that
// exists already is not written into (Internal). The node serves the next
// call on the same connection.
func TestPlaceBytes_Refused(t *testing.T) {
	var base string
	n := startPlaceNode(t, func(req *sinkReq, l Layout) (Placement, error) {
		if req.S == "exists" {
			return Placement{Prefix: base}, nil
		}
		if l.Bytes() != 4*8*4+4*8 {
			t.Errorf("layout of %d bytes, want %d", l.Bytes(), 4*8*4+4*8)
		}
		return Placement{}, Errorf(FailedPrecondition, "not today")
	})
	base = n.dir
	c := dial(t, n.addr)
	ctx := testCtx(t)
	for _, tc := range []struct {
		s    string
		code Code
	}{{"refuse", FailedPrecondition}, {"exists", Internal}} {
		_, err := Call[echoMsg](ctx, c, "test.place", sinkReq{X: Ref(placeTD(t, 4, 8, 1)), S: tc.s})
		if CodeOf(err) != tc.code {
			t.Fatalf("%s: %v, want code %v", tc.s, err, tc.code)
		}
	}
	if len(n.got) != 0 {
		t.Fatal("the handler ran")
	}
	if ents, _ := os.ReadDir(base); len(ents) != 0 {
		t.Fatalf("%s holds %v", base, ents)
	}
	echo(t, c)
}

// TestPlaceBytes_BodyCutShort: a caller that stops partway through a
// placed TD's body leaves nothing behind: the handler does not run and the
// folder, created and partly filled, is removed. The node serves others.
func TestPlaceBytes_BodyCutShort(t *testing.T) {
	var base string
	n := startPlaceNode(t, func(req *sinkReq, l Layout) (Placement, error) {
		return Placement{Prefix: filepath.Join(base, "p"), Writeback: true}, nil
	})
	base = n.dir
	req := sinkReq{X: Ref(placeTD(t, 8, 1<<16, 5))} // 2 MiB and a bit
	parts, err := req.X.prepare(link{}, nil)
	must(t, err)
	args, err := encodeMsgpack(&req)
	must(t, err)
	var body bytes.Buffer
	must(t, writeParts(&body, parts))
	for _, tc := range []struct {
		name string
		cut  int // bytes of the body sent
	}{{"in the first chunk", 1000}, {"after a chunk", 1<<20 + 5}, {"in the last tensor", body.Len() - 3}} {
		t.Run(tc.name, func(t *testing.T) {
			p := dialRaw(t, n.addr, nil)
			st := p.stream(t)
			bw := bufio.NewWriter(st)
			must(t, writeFrame(bw, &requestHeader{Method: "test.place", ArgLen: int64(len(args)), BodyLen: int64(body.Len())}, args))
			bw.Write(body.Bytes()[:tc.cut])
			must(t, bw.Flush())
			deadline := time.Now().Add(10 * time.Second)
			for { // the folder is made as the body starts
				if _, err := os.Lstat(filepath.Join(base, "p")); err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			st.Close()
			p.sess.Close()
			waitGone(t, filepath.Join(base, "p"))
			if len(n.got) != 0 {
				t.Fatal("the handler ran")
			}
			echo(t, dial(t, n.addr))
		})
	}
}

// TestPlaceBytes_OtherRequestType: PlaceBytes made for one request type
// and given to Register of another is an error, not a panic at the first
// call.
func TestPlaceBytes_OtherRequestType(t *testing.T) {
	s, err := NewServer()
	must(t, err)
	defer s.Close()
	err = Register(s, "test.wrong", func(ctx context.Context, m echoMsg) (echoMsg, error) { return m, nil },
		PlaceBytes(func(req *sinkReq, td *TD, l Layout) (Placement, error) { return Placement{}, nil }))
	if err == nil {
		t.Fatal("Register took PlaceBytes for sinkReq on a method of echoMsg")
	}
}
