package rpc

// Failure tests (failure_test.go): references that leave the root or do not
// fit their files, and TDs sent as bytes whose wire form is wrong.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// ---- references ----

// refTD is a by-reference wire TD of one tensor.
func refTD(path, dtype string, file, shape []int, off int64, batch, rows []int) *wireTD {
	return &wireTD{
		Batch: batch,
		Rows:  rows,
		Entries: []wireEntry{{
			Key: []string{"memmap"}, Kind: kindTensor, DType: dtype, Shape: shape,
			Ref: &wireRef{Path: path, File: file, Offset: off},
		}},
	}
}

// fillByRef sends a fill of value 7 through a raw peer.
func fillByRef(t *testing.T, p *rawPeer, w *wireTD) responseHeader {
	t.Helper()
	return p.rawCall(t, MethodFill, &FillRequest{TD: TD{wire: w}, Value: 7}, nil)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return b
}

func TestServer_RefOutsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	n := startTestNode(t, WithRoot(root))
	shape := []int{10, 4, 4, 3}

	// A file outside the root, shaped like the seed leaf, and the ways to
	// reach it from inside.
	victim := filepath.Join(outside, "memmap.memmap")
	must(t, os.WriteFile(victim, make([]byte, 480), 0o644))
	must(t, os.Symlink(victim, filepath.Join(root, "out.memmap")))
	must(t, os.Symlink(outside, filepath.Join(root, "outdir")))
	must(t, os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	must(t, os.Symlink("../../../"+filepath.Base(outside)+"/memmap.memmap", filepath.Join(root, "a", "b", "rel.memmap")))
	// A link inside the root to a file inside it, which must work.
	td := seedTD(t, filepath.Join(root, "td"), 10)
	must(t, os.Symlink(filepath.Join("td", "memmap.memmap"), filepath.Join(root, "in.memmap")))
	must(t, os.Symlink(filepath.Join("..", "..", "td", "memmap.memmap"), filepath.Join(root, "a", "b", "in.memmap")))
	// The root's identity, which nothing may write through a reference.
	fsidPath := filepath.Join(root, FSIDFile)
	must(t, os.Symlink(FSIDFile, filepath.Join(root, "fsid.memmap")))
	must(t, os.Link(fsidPath, filepath.Join(root, "fsid-hard.memmap")))
	fsidBefore := readFile(t, fsidPath)
	p := dialRawIn(t, n.addr, root)

	for _, tc := range []struct {
		name, path string
		want       Code
		shape      []int // of the file and the view; nil: the seed's
	}{
		{"dot-dot", "../" + filepath.Base(outside) + "/memmap.memmap", PermissionDenied, nil},
		{"dot-dot inside", "td/../../" + filepath.Base(outside) + "/memmap.memmap", PermissionDenied, nil},
		{"absolute", victim, PermissionDenied, nil},
		{"absolute inside the root", filepath.Join(root, "td", "memmap.memmap"), PermissionDenied, nil},
		{"empty", "", PermissionDenied, nil},
		{"backslash", `td\..\..\x`, PermissionDenied, nil},
		{"symlink to a file outside", "out.memmap", PermissionDenied, nil},
		{"symlink to a folder outside", "outdir/memmap.memmap", PermissionDenied, nil},
		{"relative symlink climbing out", "a/b/rel.memmap", PermissionDenied, nil},
		{"the root's identity file", FSIDFile, PermissionDenied, []int{32}},
		{"a link to the root's identity file", "fsid.memmap", PermissionDenied, []int{32}},
		{"a hard link to the root's identity file", "fsid-hard.memmap", PermissionDenied, []int{32}},
		{"missing file", "td/nothing.memmap", NotFound, nil},
		{"the file itself", "td/memmap.memmap", OK, nil},
		{"symlink inside the root", "in.memmap", OK, nil},
		{"relative symlink inside the root", "a/b/in.memmap", OK, nil},
		{"dot-dot that stays inside", "a/../td/memmap.memmap", OK, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := shape
			if tc.shape != nil {
				sh = tc.shape
			}
			rh := fillByRef(t, p, refTD(tc.path, "uint8", sh, sh, 0, sh[:1], []int{3}))
			if Code(rh.Code) != tc.want {
				t.Fatalf("fill through %q: %v %q, want %v", tc.path, Code(rh.Code), rh.Message, tc.want)
			}
			if b := readFile(t, victim); !bytes.Equal(b, make([]byte, 480)) {
				t.Fatal("the file outside the root was written")
			}
			if !bytes.Equal(readFile(t, fsidPath), fsidBefore) {
				t.Fatal("the root's identity file was written")
			}
		})
	}
	// The fills that were allowed wrote row 3 of the file inside.
	if got := rowsSet(t, td, 7); !equalInts(got, []int{3}) {
		t.Fatalf("rows of sevens inside the root: %v, want [3]", got)
	}
	echo(t, dial(t, n.addr))
}

// TestServer_ReadOutsideRoot checks the prefixes of the read and describe
// services the same way.
func TestServer_ReadOutsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	n := startTestNode(t, WithRoot(root))
	seedTD(t, filepath.Join(outside, "td"), 4)
	seedTD(t, filepath.Join(root, "td"), 4)
	must(t, os.Symlink(filepath.Join(outside, "td"), filepath.Join(root, "outlink")))
	must(t, os.MkdirAll(filepath.Join(root, "leafout"), 0o755))
	must(t, os.Symlink(filepath.Join(outside, "td", "memmap.memmap"), filepath.Join(root, "leafout", "memmap.memmap")))
	must(t, os.Link(filepath.Join(root, "td", "meta.json"), filepath.Join(root, "leafout", "meta.json")))
	c := dial(t, n.addr)
	ctx := context.Background()
	for _, tc := range []struct {
		prefix string
		want   Code
	}{
		{"../" + filepath.Base(outside) + "/td", PermissionDenied},
		{filepath.Join(outside, "td"), PermissionDenied},
		{"outlink", PermissionDenied},
		{"leafout", PermissionDenied},
		{"nothing", NotFound},
		{"td", OK},
	} {
		_, err := c.Read(ctx, tc.prefix, nil)
		if CodeOf(err) != tc.want {
			t.Errorf("Read(%q): %v, want %v", tc.prefix, err, tc.want)
		}
		_, err = c.Describe(ctx, tc.prefix)
		if CodeOf(err) != tc.want {
			t.Errorf("Describe(%q): %v, want %v", tc.prefix, err, tc.want)
		}
	}
}

func TestServer_BadReference(t *testing.T) {
	root := t.TempDir()
	n := startTestNode(t, WithRoot(root))
	td := seedTD(t, filepath.Join(root, "td"), 10)
	file := filepath.Join(root, "td", "memmap.memmap")
	must(t, td.Fill([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 5))
	before := readFile(t, file)
	p := dialRawIn(t, n.addr, root)
	shape := []int{10, 4, 4, 3}
	const path = "td/memmap.memmap"
	for _, tc := range []struct {
		name string
		w    *wireTD
		want Code
	}{
		{"row past the end", refTD(path, "uint8", shape, shape, 0, []int{10}, []int{0, 10}), InvalidArgument},
		{"negative row", refTD(path, "uint8", shape, shape, 0, []int{10}, []int{-1}), InvalidArgument},
		{"huge row", refTD(path, "uint8", shape, shape, 0, []int{10}, []int{1 << 62}), InvalidArgument},
		{"file shape larger than the file", refTD(path, "uint8", []int{20, 4, 4, 3}, []int{20, 4, 4, 3}, 0, []int{20}, []int{15}), InvalidArgument},
		{"view larger than the file shape", refTD(path, "uint8", shape, []int{20, 4, 4, 3}, 0, []int{20}, []int{0}), InvalidArgument},
		{"view past the end", refTD(path, "uint8", shape, shape, 48, []int{10}, []int{0}), InvalidArgument},
		{"negative offset", refTD(path, "uint8", shape, shape, -48, []int{10}, []int{0}), InvalidArgument},
		{"wrong dtype for the file", refTD(path, "float32", shape, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"misaligned offset", refTD(path, "int16", []int{240}, []int{2, 3}, 1, []int{2}, []int{0}), InvalidArgument},
		{"unknown dtype", refTD(path, "float7", shape, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"negative dimension", refTD(path, "uint8", []int{-10, 4, 4, 3}, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"overflowing file shape", refTD(path, "uint8", []int{1 << 40, 1 << 40}, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"batch not matching the tensor", refTD(path, "uint8", shape, shape, 0, []int{20}, []int{0}), InvalidArgument},
		{"directory", refTD("td", "uint8", shape, shape, 0, []int{10}, []int{0}), InvalidArgument},
		{"unknown entry kind", &wireTD{Batch: []int{10}, Entries: []wireEntry{{Key: []string{"x"}, Kind: "blob"}}}, InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh := fillByRef(t, p, tc.w)
			if Code(rh.Code) != tc.want {
				t.Fatalf("fill: %v %q, want %v", Code(rh.Code), rh.Message, tc.want)
			}
			if !bytes.Equal(readFile(t, file), before) {
				t.Fatal("a refused fill changed the file")
			}
		})
	}
	// The client checks rows itself, before sending anything.
	c := dial(t, n.addr, WithRoot(root))
	if err := c.Fill(context.Background(), td, []int{10}, 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Fill row 10 of 10: %v, want InvalidArgument", err)
	}
	if !bytes.Equal(readFile(t, file), before) {
		t.Fatal("a refused fill changed the file")
	}
	echo(t, c)
}

// TestServer_BadBytesTD sends TensorDicts by bytes whose wire form does not
// fit the body or itself.
func TestServer_BadBytesTD(t *testing.T) {
	n := startTestNode(t)
	p := dialRaw(t, n.addr, nil)
	tensor := func(shape ...int) wireEntry {
		return wireEntry{Key: []string{"x"}, Kind: kindTensor, DType: "uint8", Shape: shape}
	}
	for _, tc := range []struct {
		name string
		w    *wireTD
		body int
		ok   bool // nothing to fill: success is right too
	}{
		{"body too short", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(4, 2)}}, 7, false},
		{"body too long", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(4, 2)}}, 9, false},
		{"negative shape", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(-4, 2)}}, 0, false},
		{"overflowing shape", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(1<<62, 1<<62)}}, 0, false},
		{"gathered without a batch", &wireTD{Gathered: true}, 0, false},
		{"gathered, huge batch", &wireTD{Gathered: true, Batch: []int{1 << 60}}, 0, false},
		{"gathered, huge batch of empty rows", &wireTD{Gathered: true, Batch: []int{1 << 40}, Entries: []wireEntry{tensor(1<<40, 0)}}, 0, false},
		{"huge batch", &wireTD{Batch: []int{1 << 60}}, 0, true},
		{"huge batch of empty rows", &wireTD{Batch: []int{1 << 40}, Entries: []wireEntry{tensor(1<<40, 0)}}, 0, true},
		{"negative batch", &wireTD{Batch: []int{-1}}, 0, false},
		{"bad key", &wireTD{Batch: []int{4}, Entries: []wireEntry{{Kind: kindTensor, DType: "uint8", Shape: []int{4}}}}, 4, false},
		{"bad non-tensor data", &wireTD{Batch: []int{4}, Entries: []wireEntry{{Key: []string{"d"}, Kind: kindData, Data: []byte("{")}}}, 0, false},
		{"tensor under a non-dict", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor(4), {Key: []string{"x", "y"}, Kind: kindTensor, DType: "uint8", Shape: []int{4}}}}, 8, false},
		{"a reference to a node without root", refTD("td/memmap.memmap", "uint8", []int{4}, []int{4}, 0, []int{4}, nil), 0, false},
		{"sizes that add up past 2^63", &wireTD{Batch: []int{1 << 62}, Entries: []wireEntry{
			{Key: []string{"a"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
			{Key: []string{"b"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
			{Key: []string{"c"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
			{Key: []string{"d"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 62}},
		}}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh := p.rawCall(t, MethodFill, &FillRequest{TD: TD{wire: tc.w}, Value: 1}, make([]byte, tc.body))
			switch c := Code(rh.Code); {
			case c == OK && !tc.ok, c == Internal, c == Unknown:
				t.Fatalf("fill: %v %q, want a refusal", c, rh.Message)
			}
		})
	}
	echo(t, dial(t, n.addr))
}

// TestClient_BadResultTDs gives the client responses whose TensorDicts do
// not fit the body: refused as Internal before anything is allocated for
// their tensors, as the node refuses such requests.
func TestClient_BadResultTDs(t *testing.T) {
	tensor := func(key string, shape ...int) wireEntry {
		return wireEntry{Key: []string{key}, Kind: kindTensor, DType: "uint8", Shape: shape}
	}
	for _, tc := range []struct {
		name string
		w    *wireTD
		body int
	}{
		{"64 MiB claimed, none sent", &wireTD{Batch: []int{64 << 20}, Entries: []wireEntry{tensor("x", 64<<20)}}, 0},
		{"body too long", &wireTD{Batch: []int{4}, Entries: []wireEntry{tensor("x", 4)}}, 5},
		{"sizes that add up past 2^63", &wireTD{Batch: []int{1 << 62}, Entries: []wireEntry{
			tensor("a", 1<<62), tensor("b", 1<<62), tensor("c", 1<<62), tensor("d", 1<<62)}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &bodyReader{r: bytes.NewReader(make([]byte, tc.body)), n: int64(tc.body)}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := readResultTDs(body, nil, []*TD{{wire: tc.w}}, nil)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrInternal) {
				t.Fatalf("readResultTDs: %v, want Internal", err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Fatalf("%d bytes allocated for a refused response", n)
			}
		})
	}
}
