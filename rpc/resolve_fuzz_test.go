package rpc

// FuzzResolveRef and the regression tests of what it found: how a node
// resolves what a peer names under its shared root, tensor files
// (resolver.acquire, for references in a TD) and stored TensorDicts
// (resolver.acquireTD, under tensorwire.read and tensorwire.describe),
// against a real root with real TensorDicts and links out of it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// secretMarker fills the file outside the root: bytes a resolution hands
// out must never hold it.
const secretMarker = "OUTSIDE THE ROOT"

// outLinks are the names in a resolveRoot that lead out of it: a
// resolution through any of them is PermissionDenied.
var outLinks = []string{"out", "up", "outd", "outtd", "loop"}

// tdSchema is what describe says of a stored TensorDict.
type tdSchema struct {
	batch  []int
	fields []tensordict.Field
}

// resolveRoot is a shared root, and what a resolution in it may return:
//
//	root/
//	  .tensorwire-fsid        the root's identity (NewServer makes it)
//	  fsid-link               a hard link to it
//	  td/                     a TensorDict made by tensordict.Create:
//	                          memmap uint8 [8 4 3], obs/x float32 [8 2]
//	  empty/                  a TensorDict with an empty leaf (no file):
//	                          e float32 [4 0], f uint8 [4]
//	  intd -> td              a link to a folder inside
//	  in -> td/memmap.memmap  a link to a file inside
//	  out -> OUT/secret       a link to a file outside (absolute)
//	  up -> ../OUT/secret     a link to a file outside (relative)
//	  outd -> OUT             a link to the folder outside
//	  outtd -> OUT/td         a link to a TensorDict outside
//	  loop -> loop            a link to itself
//	  leaky/                  a TensorDict whose leaf a.memmap -> OUT/secret
//	  nestout/                a TensorDict whose nested sub -> OUT/etd, a
//	                          TensorDict outside with only an empty leaf
//	OUT/
//	  secret                  4 KiB of secretMarker
//	  td/                     s int64 [5 7]
//	  etd/                    z float32 [2 0]
type resolveRoot struct {
	dir     string
	outside string
	srv     *Server              // serves read and describe over dir
	res     *resolver            // a second resolver over dir, caching 2 mappings
	files   map[fileID]bool      // the regular files inside the root, but its identity
	schemas map[fileID]*tdSchema // the TensorDicts inside the root, by their meta.json
}

// newResolveRoot makes a resolveRoot in temporary folders of tb.
func newResolveRoot(tb testing.TB) *resolveRoot {
	tb.Helper()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	create := func(prefix string, batch []int, fields ...tensordict.Field) {
		tb.Helper()
		td, err := tensordict.Create(prefix, batch, fields...)
		must(err)
		must(td.Close())
	}
	dir, err := filepath.EvalSymlinks(tb.TempDir())
	must(err)
	outside, err := filepath.EvalSymlinks(tb.TempDir())
	must(err)
	r := &resolveRoot{dir: dir, outside: outside, files: map[fileID]bool{}, schemas: map[fileID]*tdSchema{}}

	must(os.WriteFile(filepath.Join(outside, "secret"), []byte(strings.Repeat(secretMarker, 4096/len(secretMarker))), 0o644))
	create(filepath.Join(outside, "td"), []int{5}, tensordict.Field{Key: []string{"s"}, DType: memmap.Int64, Shape: []int{5, 7}})
	create(filepath.Join(outside, "etd"), []int{2}, tensordict.Field{Key: []string{"z"}, DType: memmap.Float32, Shape: []int{2, 0}})

	create(filepath.Join(dir, "td"), []int{8},
		tensordict.Field{Key: []string{"memmap"}, DType: memmap.Uint8, Shape: []int{8, 4, 3}},
		tensordict.Field{Key: []string{"obs", "x"}, DType: memmap.Float32, Shape: []int{8, 2}})
	create(filepath.Join(dir, "empty"), []int{4},
		tensordict.Field{Key: []string{"e"}, DType: memmap.Float32, Shape: []int{4, 0}},
		tensordict.Field{Key: []string{"f"}, DType: memmap.Uint8, Shape: []int{4}})
	create(filepath.Join(dir, "leaky"), []int{4}, tensordict.Field{Key: []string{"a"}, DType: memmap.Uint8, Shape: []int{4}})
	must(os.Remove(filepath.Join(dir, "leaky", "a.memmap")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "leaky", "a.memmap")))
	must(os.Mkdir(filepath.Join(dir, "nestout"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "nestout", "meta.json"),
		[]byte(`{"sub":{"type":"TensorDict"},"shape":[2],"device":"cpu","_type":"<class 'tensordict._td.TensorDict'>"}`), 0o644))
	must(os.Symlink(filepath.Join(outside, "etd"), filepath.Join(dir, "nestout", "sub")))
	for link, target := range map[string]string{
		"intd":  "td",
		"in":    "td/memmap.memmap",
		"out":   filepath.Join(outside, "secret"),
		"up":    "../" + filepath.Base(outside) + "/secret",
		"outd":  outside,
		"outtd": filepath.Join(outside, "td"),
		"loop":  "loop",
	} {
		must(os.Symlink(target, filepath.Join(dir, link)))
	}

	l := DefaultLimits()
	l.MaxBodyBytes = 1 << 20
	if r.srv, err = NewServer(WithRoot(dir), WithLimits(l)); err != nil { // writes the identity file
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.srv.Close() })
	must(os.Link(filepath.Join(dir, FSIDFile), filepath.Join(dir, "fsid-link")))
	if r.res, err = newResolver(dir, 2); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.res.close() })

	// What may come out: the regular files inside (walked without
	// following links), and the TensorDicts as tensordict itself reads them.
	fsid := r.id(tb, filepath.Join(dir, FSIDFile))
	must(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if id := r.id(tb, p); id != fsid {
				r.files[id] = true
			}
		}
		return err
	}))
	for _, prefix := range []string{"td", "td/obs", "empty"} {
		p := filepath.Join(dir, prefix)
		td, err := tensordict.LoadMemmap(p, tensordict.ReadOnly())
		must(err)
		s := &tdSchema{batch: td.BatchSize()}
		for key, x := range td.Leaves() {
			s.fields = append(s.fields, tensordict.Field{Key: key, DType: x.DType(), Shape: x.Shape()})
		}
		td.Close()
		r.schemas[r.id(tb, filepath.Join(p, "meta.json"))] = s
	}
	return r
}

// id returns the identity of the file path names, following links.
func (r *resolveRoot) id(tb testing.TB, path string) fileID {
	tb.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	id, ok := fileIDOf(fi)
	if !ok {
		tb.Fatalf("%s: no inode", path)
	}
	return id
}

// escapesRoot reports whether a slash-separated path names something
// outside the folder it is resolved in, lexically, or is not a plain path
// at all: empty, absolute, climbing above its start, or holding a
// backslash or a NUL byte.
func escapesRoot(path string) bool {
	if path == "" || strings.HasPrefix(path, "/") || strings.ContainsAny(path, "\\\x00") {
		return true
	}
	depth := 0
	for _, c := range strings.Split(path, "/") {
		switch c {
		case "", ".":
		case "..":
			if depth == 0 {
				return true
			}
			depth--
		default:
			depth++
		}
	}
	return false
}

// opensOutLink reports whether resolving path, component by component from
// the root, goes through one of outLinks.
func opensOutLink(path string) bool {
	depth := 0
	for _, c := range strings.Split(path, "/") {
		switch {
		case c == "" || c == ".":
		case c == "..":
			depth = max(depth-1, 0)
		case depth == 0 && slices.Contains(outLinks, c):
			return true
		default:
			depth++
		}
	}
	return false
}

// tooLong reports whether a component of path is longer than any file name.
func tooLong(path string) bool {
	for _, c := range strings.Split(path, "/") {
		if len(c) > 255 {
			return true
		}
	}
	return false
}

// FuzzResolveRef resolves a path from the fuzzer against a resolveRoot, as
// a tensor file (whole false: a reference with a dtype, file shape, view
// shape and offset) or as a stored TensorDict (whole true: describe and
// read with rows). It asserts that
//
//   - nothing panics, and refusals are *Errors whose code says the peer is
//     at fault (PermissionDenied, NotFound, InvalidArgument; read also
//     ResourceExhausted), never Internal or Unknown;
//   - a path that leaves the root lexically (empty, absolute, "..", a
//     backslash or NUL), or through a link out, is PermissionDenied (a
//     reference with a bad dtype or file shape may be refused for that
//     first), and a name longer than the filesystem allows is refused;
//   - a tensor file resolved is a regular file inside the root (by inode)
//     and not the root's identity file, its bytes are not the outside
//     file's, and the mapping has the reference's dtype and file shape and
//     fits in the file; a view of it lies inside it; the same reference
//     again gets the cached mapping, and released mappings are idle;
//   - a TensorDict resolved is one of the root's, with the dtypes, shapes
//     and batch size of its meta.json as tensordict reads it, and each of
//     the root's TensorDicts resolves;
//   - rows out of range are refused (InvalidArgument), rows in range are
//     read, one result row each.
func FuzzResolveRef(f *testing.F) {
	r := newResolveRoot(f)
	for _, p := range []string{
		"td/memmap.memmap", "in", "intd/memmap.memmap", "td/obs/x.memmap", "./td//obs/../memmap.memmap",
		"out", "up", "outd/secret", "outd/td/s.memmap", "outtd/s.memmap", "loop", "leaky/a.memmap",
		"../" + filepath.Base(r.outside) + "/secret", r.outside + "/secret", "td\\memmap.memmap", "td/memmap.memmap\x00",
		FSIDFile, "fsid-link", "td", ".", "", "td/memmap.memmap/x", "td/meta.json", "missing",
		strings.Repeat("x", 256), strings.Repeat("d/", 2100),
	} {
		f.Add(p, "uint8", []byte{8, 4, 3}, []byte{2, 4, 3}, int64(24), []byte{0, 1}, false)
	}
	f.Add("td/obs/x.memmap", "float32", []byte{8, 2}, []byte{8, 2}, int64(0), []byte{7}, false)
	f.Add("td/obs/x.memmap", "torch.int16", []byte{32}, []byte{3}, int64(2), []byte{}, false)
	f.Add("td/obs/x.memmap", "float64", []byte{8, 2}, []byte{8, 2}, int64(0), []byte{}, false)
	f.Add("td/memmap.memmap", "float7", []byte{8, 4, 3}, []byte{8, 4, 3}, int64(0), []byte{}, false)
	f.Add("td/memmap.memmap", "uint8", []byte{0xff, 0xff}, []byte{1}, int64(-1), []byte{0xfe}, false)
	for _, p := range []string{
		"td", "intd", "td/", "./td/obs", "intd/obs", "empty", "td/obs/..",
		"outtd", "outd/td", "out", "loop", "leaky", "nestout", "nestout/sub", "outd/../td",
		"../" + filepath.Base(r.outside) + "/td", r.outside + "/td", "td\\obs", "td\x00",
		"", ".", "td/memmap.memmap", "td/meta.json", FSIDFile, "missing", strings.Repeat("x", 256),
	} {
		f.Add(p, "", []byte{}, []byte{}, int64(0), []byte{0, 3, 7}, true)
	}
	f.Add("td", "", []byte{}, []byte{}, int64(0), []byte{8}, true)
	f.Add("td/obs", "", []byte{}, []byte{}, int64(0), []byte{0xfe, 1}, true)
	f.Add("empty", "", []byte{}, []byte{}, int64(0), []byte{}, true)
	f.Add("empty", "", []byte{}, []byte{}, int64(0), []byte{3, 3, 3, 0}, true)

	f.Fuzz(func(t *testing.T, path, dtype string, file, shape []byte, off int64, rowBytes []byte, whole bool) {
		var rows []int // nil: all rows
		if len(rowBytes) > 0 {
			rows = dims(rowBytes)
		}
		// A stored TensorDict's prefix is cleaned before it is opened, a
		// reference's path is not.
		if whole {
			denied := escapesRoot(path) || opensOutLink(filepath.ToSlash(filepath.Clean(path)))
			r.checkTD(t, path, rows, denied)
		} else {
			// A reference's dtype and file shape are checked before its
			// path is looked up.
			dt, _ := memmap.ParseDType(dtype) // Invalid when unknown: acquire must refuse it
			_, bad := memmap.NumBytes(dt, dims(file))
			denied := escapesRoot(path) || bad == nil && opensOutLink(path)
			r.checkFile(t, path, dt, dims(file), dims(shape), off, rows, denied)
		}
		for _, res := range []*resolver{r.res, r.srv.res} {
			res.mu.Lock()
			for k, m := range res.cache {
				if m.refs != 0 || m.stale {
					t.Errorf("after the calls, mapping %+v has %d refs, stale %v", k, m.refs, m.stale)
				}
			}
			res.mu.Unlock()
		}
	})
}

// checkCode fails t unless err is, by the code a caller would get, a
// refusal of the peer's doing, and PermissionDenied when denied.
func checkCode(t *testing.T, what string, err error, denied bool, also ...Code) {
	t.Helper()
	switch c := CodeOf(err); {
	case denied && c != PermissionDenied:
		t.Fatalf("%s: %v, want PermissionDenied", what, err)
	case c != PermissionDenied && c != NotFound && c != InvalidArgument && !slices.Contains(also, c):
		t.Fatalf("%s: %v: a code that blames the node", what, err)
	}
}

// checkFile resolves path as a tensor reference (see FuzzResolveRef).
func (r *resolveRoot) checkFile(t *testing.T, path string, dt memmap.DType, file, shape []int, off int64, rows []int, denied bool) {
	ref := &wireRef{Path: path, File: file, Offset: off}
	m, err := r.res.acquire(ref, dt)
	if err != nil {
		if e := (*Error)(nil); !errors.As(err, &e) {
			t.Fatalf("acquire %s: %v, want an *Error", quote(path), err)
		}
		checkCode(t, "acquire "+quote(path), err, denied)
		return
	}
	defer r.res.release(m)
	switch {
	case denied:
		t.Fatalf("acquire %q: resolved, want PermissionDenied", path)
	case tooLong(path):
		t.Fatalf("acquire %q: resolved a name too long for a file", path)
	case !dt.Valid():
		t.Fatalf("acquire %q: resolved with dtype %v", path, dt)
	case m.mm == nil:
		t.Fatalf("acquire %q: a mapping without a file", path)
	case m.mm.DType() != dt || !slices.Equal(m.mm.Shape(), file):
		t.Fatalf("acquire %q %v %v: mapped as %v %v", path, dt, file, m.mm.DType(), m.mm.Shape())
	}
	// The file mapped, found by the name the mapping has, following every
	// link the way the host does, not the way os.Root does.
	fi, err := os.Stat(m.mm.Path())
	if err != nil {
		t.Fatalf("acquire %q: the mapped file %s: %v", path, m.mm.Path(), err)
	}
	if id, _ := fileIDOf(fi); !r.files[id] {
		t.Fatalf("acquire %q: mapped %s, not a regular file inside the root", path, m.mm.Path())
	}
	if want, _ := memmap.NumBytes(dt, file); m.mm.NumBytes() != want || int64(want) > fi.Size() {
		t.Fatalf("acquire %q %v %v: a mapping of %d bytes of a %d-byte file", path, dt, file, m.mm.NumBytes(), fi.Size())
	}
	if b, err := m.mm.Bytes(); err != nil {
		t.Fatalf("acquire %q: %v", path, err)
	} else if strings.Contains(string(b), secretMarker) {
		t.Fatalf("acquire %q: mapped the file outside the root", path)
	}
	// The same reference again is the cached mapping.
	if m2, err := r.res.acquire(ref, dt); err != nil || m2 != m {
		t.Fatalf("acquire %q again: %p, %v; want the cached %p", path, m2, err, m)
	} else {
		r.res.release(m2)
	}

	// A view, as build makes one, lies inside the mapping; rows of it are
	// read only in range.
	x, err := tensordict.View(m.mm, off, shape...)
	if err != nil {
		return
	}
	if _, voff := x.Mapping(); voff < 0 || voff+int64(x.NumBytes()) > int64(m.mm.NumBytes()) {
		t.Fatalf("a view of %d bytes at %d of %d", x.NumBytes(), voff, m.mm.NumBytes())
	}
	if rows == nil {
		return
	}
	g, err := x.Gather(rows)
	inRange := len(shape) > 0 && memmap.CheckRows(rows, x.Len()) == nil
	switch {
	case err == nil && !inRange:
		t.Fatalf("rows %v of a view of shape %v: gathered", rows, shape)
	case err != nil && inRange:
		t.Fatalf("rows %v of a view of shape %v: %v", rows, shape, err)
	case err == nil && g.Len() != len(rows):
		t.Fatalf("rows %v gathered as %d rows", rows, g.Len())
	}
}

// checkTD resolves path as a stored TensorDict, with describe and read (see
// FuzzResolveRef).
func (r *resolveRoot) checkTD(t *testing.T, path string, rows []int, denied bool) {
	ctx := context.Background()
	// Which of the root's TensorDicts path names, if any, found the way the
	// host finds it: every link followed, then checked to be inside.
	var want *tdSchema
	host := filepath.Join(r.dir, filepath.FromSlash(path))
	if real, err := filepath.EvalSymlinks(host); err == nil && !escapesRoot(path) {
		if rel, err := filepath.Rel(r.dir, real); err == nil && (filepath.IsLocal(rel) || rel == ".") {
			if fi, err := os.Stat(filepath.Join(real, "meta.json")); err == nil {
				id, _ := fileIDOf(fi)
				want = r.schemas[id]
			}
		}
	}
	d, derr := r.srv.describe(ctx, DescribeRequest{Prefix: path})
	rr, rerr := r.srv.read(ctx, ReadRequest{Prefix: path, Rows: rows})
	if derr != nil {
		checkCode(t, "describe "+quote(path), derr, denied)
		if want != nil && !denied {
			t.Fatalf("describe %q: %v, but it names one of the root's TensorDicts", path, derr)
		}
		if rerr == nil {
			t.Fatalf("describe %q: %v, but read succeeded", path, derr)
		}
		return
	}
	switch {
	case denied:
		t.Fatalf("describe %q: resolved, want PermissionDenied", path)
	case want == nil:
		t.Fatalf("describe %q: resolved %v %v, not one of the root's TensorDicts", path, d.Batch, d.Fields)
	case !slices.Equal(d.Batch, want.batch) || len(d.Fields) != len(want.fields):
		t.Fatalf("describe %q: %v %v, want %v %v", path, d.Batch, d.Fields, want.batch, want.fields)
	}
	for i, fi := range d.Fields {
		if w := want.fields[i]; !slices.Equal(fi.Key, w.Key) || fi.DType != w.DType || !slices.Equal(fi.Shape, w.Shape) {
			t.Fatalf("describe %q: field %v, want %v", path, fi, w)
		}
	}

	n := want.batch[0]
	inRange := memmap.CheckRows(rows, n) == nil
	if rerr != nil {
		checkCode(t, "read "+quote(path), rerr, false, ResourceExhausted)
		if inRange {
			t.Fatalf("read %q rows %v of %d: %v", path, rows, n, rerr)
		}
		if CodeOf(rerr) != InvalidArgument {
			t.Fatalf("read %q rows %v of %d: %v, want InvalidArgument", path, rows, n, rerr)
		}
		return
	}
	if !inRange {
		t.Fatalf("read %q rows %v of %d: read", path, rows, n)
	}
	want0 := len(rows)
	if rows == nil {
		want0 = n
	}
	got := rr.TD.TensorDict
	if rr.Rows != want0 || got == nil || got.Len() != want0 {
		t.Fatalf("read %q rows %v: %d rows, %v", path, rows, rr.Rows, got)
	}
	for key, x := range got.Leaves() {
		if b, err := x.Bytes(); err != nil || strings.Contains(string(b), secretMarker) {
			t.Fatalf("read %q: leaf %v: %v, or the outside file's bytes", path, key, err)
		}
	}
}

// quote is %q, short.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return `"` + strings.ToValidUTF8(s, "?") + `"`
}

// waitOrUnblock runs fn, and if it has not returned after d, opens fifo for
// writing so that whatever blocks in it returns, and fails t.
func waitOrUnblock(t *testing.T, d time.Duration, fifo string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		err := <-done
		t.Fatalf("still blocked after %v (on the FIFO %s); unblocked, it returned %v", d, fifo, err)
		return err
	}
}

// TestResolve_Refusals pins what FuzzResolveRef found: names that no file
// can have, paths through a file, the root's identity file, and files that
// are not regular files are refusals of the peer's request with a code
// that says so, promptly (a FIFO once hung the call), and a stored
// TensorDict with an empty leaf (no file) resolves.
func TestResolve_Refusals(t *testing.T) {
	r := newResolveRoot(t)
	fifo := filepath.Join(r.dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	if err := os.Mkdir(filepath.Join(r.dir, "fifotd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(r.dir, "fifotd", "meta.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		whole      bool
		want       Code
	}{
		{"NUL", "td/memmap.memmap\x00", false, PermissionDenied},
		{"NUL, TensorDict", "td\x00", true, PermissionDenied},
		{"name too long", strings.Repeat("x", 256), false, InvalidArgument},
		{"name too long, TensorDict", strings.Repeat("x", 256), true, InvalidArgument},
		{"through a file", "td/memmap.memmap/x", false, NotFound},
		{"through a file, TensorDict", "td/memmap.memmap", true, NotFound},
		{"identity file", FSIDFile, false, PermissionDenied},
		{"identity file, hard link", "fsid-link", false, PermissionDenied},
		{"directory", "td", false, InvalidArgument},
		{"FIFO", "fifo", false, InvalidArgument},
		{"FIFO meta.json", "fifotd", true, InvalidArgument},
		{"TensorDict nested out, empty leaves only", "nestout", true, PermissionDenied},
		{"TensorDict with a leaf out", "leaky", true, PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := waitOrUnblock(t, 30*time.Second, filepath.Join(r.dir, "fifotd", "meta.json"), func() error {
				if tc.whole {
					_, err := r.srv.describe(context.Background(), DescribeRequest{Prefix: tc.path})
					return err
				}
				m, err := r.res.acquire(&wireRef{Path: tc.path, File: []int{4}}, memmap.Uint8)
				if err == nil {
					r.res.release(m)
				}
				return err
			})
			if CodeOf(err) != tc.want {
				t.Fatalf("%q: %v, want %v", tc.path, err, tc.want)
			}
		})
	}
	t.Run("empty leaf", func(t *testing.T) {
		d, err := r.srv.describe(context.Background(), DescribeRequest{Prefix: "empty"})
		if err != nil || len(d.Fields) != 2 || !slices.Equal(d.Fields[0].Shape, []int{4, 0}) {
			t.Fatalf("describe: %+v, %v", d, err)
		}
		rr, err := r.srv.read(context.Background(), ReadRequest{Prefix: "empty", Rows: []int{3, 0}})
		if err != nil || rr.Rows != 2 {
			t.Fatalf("read: %+v, %v", rr, err)
		}
	})
}

// TestResolve_NameSwappedBeforeOpen: the resolver stats a reference's name
// and then opens it; a name replaced in between is judged by the file
// opened, not the one the stat saw. A hard link to the root's identity
// file swapped in is PermissionDenied (the file is not mapped, read-write
// or at all), and an innocent file swapped in is mapped and cached as
// itself, so that the name is mapped anew once it names the first file
// again. Both failed before open checked the file it opened: the identity
// file was mapped read-write, and the mapping of the swapped-in file was
// served for the first file's name and inode afterwards.
func TestResolve_NameSwappedBeforeOpen(t *testing.T) {
	root := t.TempDir()
	if _, err := ReadFSID(root); err != nil {
		t.Fatal(err)
	}
	res, err := newResolver(root, 4)
	must(t, err)
	t.Cleanup(func() { res.close() })
	in := func(name string) string { return filepath.Join(root, name) }
	must(t, os.WriteFile(in("a"), bytes.Repeat([]byte{1}, 33), 0o644))
	must(t, os.WriteFile(in("b"), bytes.Repeat([]byte{2}, 33), 0o644))
	must(t, os.Link(in(FSIDFile), in("f")))
	// point makes x name the file at src, atomically (as a rename does).
	point := func(src string) {
		os.Remove(in("tmp"))
		must(t, os.Link(in(src), in("tmp")))
		must(t, os.Rename(in("tmp"), in("x")))
	}
	ref := &wireRef{Path: "x", File: []int{33}}
	key := mapKey{path: "x", dtype: memmap.Uint8, shape: fmt.Sprint(ref.File)}
	// acquireSwapped is acquire with x pointed at src between the stat and
	// the open: the race, played in order.
	acquireSwapped := func(src string) (*mapping, error) {
		return res.get(key, "x", func(fileID) (*mapping, error) {
			point(src)
			return res.open("x", ref, memmap.Uint8)
		})
	}
	first := func(m *mapping) byte {
		b, err := m.mm.Bytes()
		must(t, err)
		return b[0]
	}

	t.Run("identity file", func(t *testing.T) {
		res.sweep(0) // nothing cached from before
		point("a")
		m, err := acquireSwapped("f")
		if err == nil {
			b, _ := m.mm.Bytes()
			res.release(m)
			t.Fatalf("a name swapped for a link to %s was mapped (%q)", FSIDFile, b)
		}
		if CodeOf(err) != PermissionDenied {
			t.Fatalf("a name swapped for a link to %s: %v, want PermissionDenied", FSIDFile, err)
		}
	})
	t.Run("innocent file", func(t *testing.T) {
		res.sweep(0) // nothing cached from before
		point("a")
		m, err := acquireSwapped("b")
		must(t, err)
		if got := first(m); got != 2 {
			t.Fatalf("mapped a file of %d, want the one opened (2)", got)
		}
		res.release(m)
		point("a")
		m, err = res.acquire(ref, memmap.Uint8)
		must(t, err)
		defer res.release(m)
		if got := first(m); got != 1 {
			t.Fatalf("x names a again, but its reference maps a file of %d, want 1: the mapping of the file swapped in was cached under a's inode", got)
		}
	})
	t.Run("race", func(t *testing.T) {
		// The same, raced for real: x swapped between a and the link to
		// the identity file as fast as the resolver resolves it.
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				src := in("a")
				if i%2 == 1 {
					src = in("f")
				}
				os.Remove(in("tmp2"))
				if os.Link(src, in("tmp2")) == nil {
					os.Rename(in("tmp2"), in("x"))
				}
			}
		}()
		defer func() { close(stop); <-done }()
		res.sweep(0)
		deadline := time.Now().Add(time.Second) // it mapped the identity file within 10 ms before the fix
		for n := 0; time.Now().Before(deadline); n++ {
			m, err := res.acquire(ref, memmap.Uint8)
			if err == nil {
				b, _ := m.mm.Bytes()
				hit := b[0] != 1
				res.release(m)
				if hit {
					t.Fatalf("after %d references, one was mapped onto the root's identity file (%q), read-write", n, b)
				}
			}
			res.sweep(0)
		}
	})
}

// TestResolveTD_NonTensorOutsideRoot: a stored TensorDict whose non-tensor
// folder is a link out of the root is refused. (LoadMemmap used to read it
// through the link while the resolver checked only tensor leaves, so read
// returned the outside file's data to the peer.)
func TestResolveTD_NonTensorOutsideRoot(t *testing.T) {
	r := newResolveRoot(t)
	info := filepath.Join(r.outside, "info")
	if err := os.Mkdir(info, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(info, "meta.json"),
		[]byte(`{"_type":"<class 'tensordict.tensorclass.NonTensorData'>","data":"`+secretMarker+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(r.dir, "nt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "nt", "meta.json"),
		[]byte(`{"info":{"type":"NonTensorData"},"shape":[2],"device":"cpu","_type":"<class 'tensordict._td.TensorDict'>"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(info, filepath.Join(r.dir, "nt", "info")); err != nil {
		t.Fatal(err)
	}
	rr, err := r.srv.read(context.Background(), ReadRequest{Prefix: "nt"})
	if err == nil {
		nt, _ := rr.TD.NonTensor("info")
		t.Fatalf("read a TensorDict with non-tensor data outside the root: %+v", nt)
	}
	if CodeOf(err) != PermissionDenied {
		t.Fatalf("read: %v, want PermissionDenied", err)
	}
}

// TestResolveTD_FIFOLeaf: a stored TensorDict whose leaf file is a FIFO
// (inside the root here; a link out to one blocked the same way) is
// InvalidArgument at once. LoadMemmap used to open leaves before the
// resolver could check them, and opening a FIFO blocks until a writer
// comes: describe and read never returned.
func TestResolveTD_FIFOLeaf(t *testing.T) {
	r := newResolveRoot(t)
	dir := filepath.Join(r.dir, "fifoleaf")
	td, err := tensordict.Create(dir, []int{2}, tensordict.Field{Key: []string{"a"}, DType: memmap.Uint8, Shape: []int{2}})
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	leaf := filepath.Join(dir, "a.memmap")
	if err := os.Remove(leaf); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(leaf, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	err = waitOrUnblock(t, 30*time.Second, leaf, func() error {
		_, err := r.srv.describe(context.Background(), DescribeRequest{Prefix: "fifoleaf"})
		return err
	})
	if CodeOf(err) != InvalidArgument {
		t.Fatalf("describe: %v, want InvalidArgument", err)
	}
}

// TestGather_ZeroByteRows: rows of a mapped view whose rows have no bytes
// (shape [8 0]) are served when in range. memmap's checkView used to bound
// such rows by the number asked for, refusing [1] and [7 7]. Found by
// FuzzResolveRef, with a reference to a file of shape [0] and a view of
// shape [8 0].
func TestGather_ZeroByteRows(t *testing.T) {
	r := newResolveRoot(t)
	m, err := r.res.acquire(&wireRef{Path: "td/obs/x.memmap", File: []int{0}}, memmap.Float32)
	if err != nil {
		t.Fatal(err)
	}
	defer r.res.release(m)
	x, err := tensordict.View(m.mm, 0, 8, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Gather([]int{1}); err != nil {
		t.Errorf("Gather row 1 of a view of shape [8 0]: %v", err)
	}
	if err := x.Fill([]int{7, 7}, 1); err != nil {
		t.Errorf("Fill rows [7 7] of a view of shape [8 0]: %v", err)
	}
}
