package rpc

// Fuzz tests of everything that parses bytes from a peer: hellos, the
// handshake, message headers, and TensorDicts in arguments (and, in
// resolve_fuzz_test.go, the paths of references; in compress_test.go,
// compressed bodies; in stream_fuzz_test.go, message streams). Run one with
//
//	go test -run '^$' -fuzz '^FuzzWireTD$' -fuzztime 30s ./rpc/
//
// testdata/fuzz/<target>/ holds each target's corpus, run with the ordinary
// tests and the fuzzer's start: inputs that once failed, and a few the
// fuzzer found that reach code the seeds added here do not.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// FuzzParseHello parses arbitrary bytes as a hello: refusals wrap
// errHandshake, and a hello accepted marshals back to exactly the bytes it
// came from (no field, reserved byte or flag is silently ignored).
func FuzzParseHello(f *testing.F) {
	for _, tok := range [][]byte{nil, []byte("t")} {
		h, err := newHello(FSID{1, 2, 3}, tok)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(h.marshal())
	}
	f.Add([]byte(magic))
	f.Add(make([]byte, helloSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			if !errors.Is(err, errHandshake) {
				t.Fatalf("parseHello error %v does not wrap errHandshake", err)
			}
			return
		}
		if got := h.marshal(); !bytes.Equal(got, b) {
			t.Fatalf("parseHello(%x) = %+v, which marshals to %x", b, h, got)
		}
	})
}

// fakeConn reads a fixed input and records what is written.
type fakeConn struct {
	r io.Reader
	w bytes.Buffer
}

func (c *fakeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// FuzzServerHandshake feeds the server side a client's bytes, with and
// without a token: a peer whose hello is malformed is told nothing; anyone
// else first gets the server's own well-formed hello; a refusal is one
// status that is not OK and a bounded message; and the server accepts only
// without a token (a valid proof needs its fresh nonce), then answers with
// exactly one OK byte and takes the peer's identity from its hello.
func FuzzServerHandshake(f *testing.F) {
	for _, tok := range [][]byte{nil, []byte("t")} {
		h, err := newHello(FSID{9}, tok)
		if err != nil {
			f.Fatal(err)
		}
		b := h.marshal()
		f.Add(b, false)
		f.Add(b, true)
		f.Add(append(b, make([]byte, proofSize)...), true)
		f.Add(append(b, bytes.Repeat([]byte{0xff}, 2*proofSize)...), true)
	}
	f.Add([]byte("TWRP"), true)
	token := []byte("fuzz token")
	fsid := FSID{0xaa}
	f.Fuzz(func(t *testing.T, in []byte, withToken bool) {
		var tok []byte
		if withToken {
			tok = token
		}
		c := &fakeConn{r: bytes.NewReader(in)}
		peer, err := serverHandshake(c, rootSide{fsid: fsid}, tok)
		out := c.w.Bytes()
		theirs, perr := parseHello(in[:min(len(in), helloSize)])
		if perr != nil {
			// Nothing is said to a peer that does not speak the protocol.
			if err == nil || len(out) != 0 {
				t.Fatalf("malformed hello: err %v, wrote %x", err, out)
			}
			return
		}
		if len(out) < helloSize {
			t.Fatalf("wrote %d bytes, not a hello", len(out))
		}
		mine, herr := parseHello(out[:helloSize])
		// The server answers in the client's version when it speaks it.
		wantVersion := uint8(ProtocolVersion)
		if speaks(theirs.version) {
			wantVersion = theirs.version
		}
		if herr != nil || mine.version != wantVersion || mine.fsid != fsid || (mine.flags&flagToken != 0) != withToken {
			t.Fatalf("the server's hello %x: %+v, %v", out[:helloSize], mine, herr)
		}
		if err != nil {
			if len(out) > helloSize+3+maxStatusMsg {
				t.Fatalf("a refusal of %d bytes", len(out))
			}
			if len(out) > helloSize && readStatus(bytes.NewReader(out[helloSize:])) == nil {
				// Version 4 accepts, then exchanges where messages: a
				// client that sends no valid one fails the handshake
				// after the node's (which offers no probe: this node has
				// no root).
				want := []byte{0}
				if theirs.version >= sideVersion {
					want = append(want, make([]byte, sessionSize)...)
				}
				if theirs.version < sharingVersion || !bytes.HasPrefix(out[helloSize:], want) ||
					len(out) != helloSize+len(want)+serverWhereSize || !bytes.Equal(out[len(out)-16:], make([]byte, 16)) {
					t.Fatalf("refused with %v but wrote an OK status", err)
				}
			}
			return
		}
		// Success needs the server's random nonce in the proof: no input
		// can carry it.
		if withToken {
			t.Fatalf("accepted %x without a valid proof", in)
		}
		if !speaks(theirs.version) || peer.version != theirs.version || theirs.flags != 0 || peer.fsid != theirs.fsid {
			t.Fatalf("accepted hello %+v, peer %+v", theirs, peer)
		}
		// Version 3 ends with the session message, which offers no side
		// connections here (serverHandshake offers none).
		want := []byte{0}
		if theirs.version >= sideVersion {
			want = append(want, make([]byte, sessionSize)...)
		}
		if theirs.version >= sharingVersion {
			// The node's where message: no probe (it has no root), and
			// the host this fuzz node was given (none).
			want = append(want, serverWhere{}.marshal()...)
		}
		if !bytes.Equal(out[helloSize:], want) {
			t.Fatalf("accepted, but wrote %x after the hello", out[helloSize:])
		}
	})
}

// FuzzClientHandshake feeds the client side a server's bytes: it must not
// panic, and with a token it must never trust a server that cannot know it.
func FuzzClientHandshake(f *testing.F) {
	for _, tok := range [][]byte{nil, []byte("t")} {
		h, err := newHello(FSID{9}, tok)
		if err != nil {
			f.Fatal(err)
		}
		b := h.marshal()
		f.Add(append(b, 0), false)
		f.Add(append(append(b, 0), make([]byte, proofSize)...), true)
		f.Add(append(b, byte(Unauthenticated), 0, 3, 'b', 'a', 'd'), true)
		f.Add(append(b, byte(Unauthenticated), 0xff, 0xff), true)
	}
	token := []byte("fuzz token")
	f.Fuzz(func(t *testing.T, in []byte, withToken bool) {
		var tok []byte
		if withToken {
			tok = token
		}
		c := &fakeConn{r: bytes.NewReader(in)}
		_, err := clientHandshake(c, rootSide{fsid: FSID{0xbb}}, tok)
		if err == nil && withToken {
			t.Fatalf("trusted a server that sent %x", in)
		}
		var e *Error
		if errors.As(err, &e) && e.Code == OK {
			t.Fatalf("an error with code OK: %v", err)
		}
	})
}

// FuzzReadHeader reads arbitrary bytes as a request and as a response
// header: a length of 0 or over the limit is errProtocol, refused without
// reading on past the length; checkLens refuses only with errProtocol; and a
// header read encodes to bytes that read back equal.
func FuzzReadHeader(f *testing.F) {
	frame := func(h header) []byte {
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		if err := writeFrame(bw, h, nil); err != nil {
			f.Fatal(err)
		}
		bw.Flush()
		return buf.Bytes()
	}
	f.Add(frame(&requestHeader{Method: MethodFill, TimeoutUS: 1e6, ArgLen: 100, BodyLen: 1 << 20}))
	f.Add(frame(&requestHeader{Method: string(make([]byte, 300)), ArgLen: -1, BodyLen: math.MaxInt64}))
	f.Add(frame(&responseHeader{Code: uint8(NotFound), Message: "no such file"}))
	f.Add(frame(&responseHeader{ArgLen: 12, BodyLen: 4 << 30}))
	f.Add(frame(&responseHeader{Code: uint8(Aborted), Message: "expired", Reason: "replay.expired"}))
	f.Add(framed(9, []byte{0x81, 0xa6, 'r', 'e', 'a', 's', 'o', 'n', 0xc0}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x80})
	f.Add([]byte{0, 0, 0, 5, 0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 6, 0x81, 0xa1, 'x', 0xdd, 0xff, 0xff})
	const max = 4 << 10
	lim := Limits{MaxHeaderBytes: max, MaxArgBytes: 1 << 20, MaxBodyBytes: 1 << 30}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, h := range []header{&requestHeader{}, &responseHeader{}} {
			r := bufio.NewReader(bytes.NewReader(b))
			err := readHeader(r, max, h)
			// (What readHeader allocates is tested in
			// TestReadHeader_AllocatesWithinLimit: runtime.ReadMemStats
			// stops the world, too slow for a fuzz body.)
			if len(b) >= 4 {
				if n := binary.BigEndian.Uint32(b); n == 0 || n > max {
					if !errors.Is(err, errProtocol) {
						t.Fatalf("header length %d: %v, want errProtocol", n, err)
					}
					if read := len(b) - r.Buffered(); read > 4+r.Size() {
						t.Fatalf("read %d bytes past a refused length", read)
					}
				}
			}
			if err != nil {
				continue
			}
			var lerr error
			switch h := h.(type) {
			case *requestHeader:
				lerr = checkLens(h.ArgLen, h.BodyLen, &lim)
			case *responseHeader:
				lerr = checkLens(h.ArgLen, h.BodyLen, &lim)
			}
			if lerr != nil && !errors.Is(lerr, errProtocol) {
				t.Fatalf("checkLens: %v", lerr)
			}
			// What was read re-encodes to a header that reads the same.
			var buf bytes.Buffer
			bw := bufio.NewWriter(&buf)
			if err := writeFrame(bw, h, nil); err != nil {
				t.Fatal(err)
			}
			bw.Flush()
			again := reflect.New(reflect.TypeOf(h).Elem()).Interface().(header)
			if err := readHeader(bufio.NewReader(&buf), 1<<30, again); err != nil || !reflect.DeepEqual(again, h) {
				t.Fatalf("%+v re-encoded reads as %+v, %v", h, again, err)
			}
		}
	})
}

// fuzzRequest is a request with TensorDicts in the places Register finds
// them.
type fuzzRequest struct {
	TD   TD    `codec:"td"`
	More []TD  `codec:"more"`
	P    *TD   `codec:"p"`
	N    int   `codec:"n"`
	Arr  [1]TD `codec:"arr"`
}

// fuzzRoot makes a root with a TensorDict in it, links in and out of it,
// and a file outside, and returns the root and a resolver over it.
func fuzzRoot(f *testing.F) (string, *resolver) {
	root, err := filepath.EvalSymlinks(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	outside := f.TempDir()
	td, err := tensordict.Create(filepath.Join(root, "td"), []int{8},
		tensordict.Field{Key: []string{"memmap"}, DType: memmap.Uint8, Shape: []int{8, 4, 3}},
		tensordict.Field{Key: []string{"obs", "x"}, DType: memmap.Float32, Shape: []int{8, 2}})
	if err != nil {
		f.Fatal(err)
	}
	td.Close()
	if err := os.WriteFile(filepath.Join(outside, "secret"), make([]byte, 4096), 0o644); err != nil {
		f.Fatal(err)
	}
	for link, target := range map[string]string{
		"out":  filepath.Join(outside, "secret"),
		"outd": outside,
		"in":   "td/memmap.memmap",
		"up":   "../" + filepath.Base(outside) + "/secret",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			f.Fatal(err)
		}
	}
	res, err := newResolver(root, 4)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { res.close() })
	return root, res
}

// FuzzWireTD decodes arbitrary msgpack as a request with TDs everywhere
// Register finds them, and builds them over fuzzRoot with an arbitrary body:
// nothing panics, refusals are *Errors with a code, every mapped leaf is a
// file inside the root and its view lies inside the mapping, and the fill
// service runs on whatever was built.
func FuzzWireTD(f *testing.F) {
	root, res := fuzzRoot(f)
	add := func(req fuzzRequest, body int) {
		b, err := encodeMsgpack(&req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, make([]byte, body))
	}
	ref := func(path, dtype string, file, shape []int, off int64) wireEntry {
		return wireEntry{Key: []string{"memmap"}, Kind: kindTensor, DType: dtype, Shape: shape, Ref: &wireRef{Path: path, File: file, Offset: off}}
	}
	seed := []int{8, 4, 3}
	for _, path := range []string{"td/memmap.memmap", "in", "out", "outd/secret", "up", "../x", "/etc/passwd", "td", "", "td/obs/x.memmap"} {
		add(fuzzRequest{TD: TD{wire: &wireTD{Batch: []int{8}, Rows: []int{1, 7}, Entries: []wireEntry{ref(path, "uint8", seed, seed, 0)}}}}, 0)
	}
	add(fuzzRequest{TD: TD{wire: &wireTD{Batch: []int{2}, Entries: []wireEntry{ref("td/memmap.memmap", "uint8", seed, []int{2, 4, 3}, 24)}}}}, 0)
	add(fuzzRequest{TD: TD{wire: &wireTD{Batch: []int{8}, Entries: []wireEntry{
		{Key: []string{"obs"}, Kind: kindDict, Shape: []int{8}},
		{Key: []string{"obs", "x"}, Kind: kindTensor, DType: "float32", Shape: []int{8, 2}, Ref: &wireRef{Path: "td/obs/x.memmap", File: []int{8, 2}}},
		{Key: []string{"note"}, Kind: kindData, Data: []byte(`{"a":[1,2]}`)},
	}}}}, 0)
	bytesTD := &wireTD{Batch: []int{3}, Gathered: true, Out: true, Entries: []wireEntry{
		{Key: []string{"a"}, Kind: kindTensor, DType: "int16", Shape: []int{3, 2}},
		{Key: []string{"b"}, Kind: kindDict, Shape: []int{3}},
		{Key: []string{"b", "c"}, Kind: kindTensor, DType: "bool", Shape: []int{3}},
	}}
	add(fuzzRequest{TD: TD{wire: bytesTD}, More: []TD{{wire: bytesTD}}, P: &TD{wire: bytesTD}}, 3*15)
	placeable := *bytesTD
	placeable.Out = false
	add(fuzzRequest{TD: TD{wire: &placeable}}, 15) // an odd body: placed
	add(fuzzRequest{Arr: [1]TD{{wire: &wireTD{Batch: []int{1 << 40}, Entries: []wireEntry{{Key: []string{"z"}, Kind: kindTensor, DType: "uint8", Shape: []int{1 << 40, 0}}}}}}}, 0)
	add(fuzzRequest{TD: TD{wire: &wireTD{Gathered: true}}}, 0)

	rootReal := root
	// With an odd body, every TD PlaceBytes can place is placed in a new
	// folder under the root's placed/, which must be empty once the call's
	// hold is released.
	placeDir := filepath.Join(root, "placed")
	if err := os.Mkdir(placeDir, 0o755); err != nil {
		f.Fatal(err)
	}
	var placedN atomic.Int64
	f.Fuzz(func(t *testing.T, args, body []byte) {
		var req fuzzRequest
		if err := decodeMsgpack(args, &req); err != nil {
			return
		}
		tds := findTDs(reflect.ValueOf(&req).Elem(), nil)
		in := &incoming{method: "fuzz", args: args, body: &bodyReader{r: bytes.NewReader(body), n: int64(len(body))}, res: res}
		var where func(*TD, Layout) (Placement, error)
		if len(body)%2 == 1 {
			where = func(*TD, Layout) (Placement, error) {
				return Placement{Prefix: filepath.Join(placeDir, strconv.FormatInt(placedN.Add(1), 10)), Writeback: true}, nil
			}
		}
		err := in.buildTDs(tds, where)
		defer func() {
			in.release()
			if ents, _ := os.ReadDir(placeDir); len(ents) != 0 {
				t.Fatalf("placed folders left after the call: %v", ents)
			}
		}()
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == OK || e.Code == Unknown {
				t.Fatalf("buildTDs: %v, want an *Error with a code", err)
			}
			return
		}
		for _, td := range tds {
			if td.TensorDict == nil {
				continue
			}
			for path, x := range td.Leaves() {
				mm, _ := x.Mapping()
				if mm == nil {
					continue
				}
				real, err := filepath.EvalSymlinks(mm.Path())
				if err != nil {
					t.Fatalf("leaf %v maps %s: %v", path, mm.Path(), err)
				}
				if rel, err := filepath.Rel(rootReal, real); err != nil || !filepath.IsLocal(rel) {
					t.Fatalf("leaf %v maps %s, outside the root %s", path, real, rootReal)
				}
				if b, err := x.Bytes(); err == nil && len(b) > 0 {
					_ = b[len(b)-1] // the view lies inside the mapping
				}
			}
		}
		// The fill service runs on whatever was built without panicking
		// (a panic in it would be reported as Internal, so call it bare).
		fill(context.Background(), FillRequest{TD: req.TD, Value: 1, Src: req.P}, 1<<20)
	})
}

// dims turns fuzz bytes into dimensions, mostly small, with a few that
// overflow or are negative.
func dims(b []byte) []int {
	out := make([]int, 0, len(b))
	for _, c := range b {
		switch c {
		case 0xff:
			out = append(out, 1<<40)
		case 0xfe:
			out = append(out, -1)
		case 0xfd:
			out = append(out, math.MaxInt)
		default:
			out = append(out, int(c%16))
		}
	}
	return out
}

// FuzzBuildTD builds a one-tensor TD from fields chosen by the fuzzer (the
// byte-level FuzzWireTD rarely gets a whole msgpack TD right), then runs
// the fill service on it: nothing panics, refusals are *Errors, and views
// stay inside the root and inside their files.
func FuzzBuildTD(f *testing.F) {
	root, res := fuzzRoot(f)
	f.Add("td/memmap.memmap", "uint8", []byte{8, 4, 3}, []byte{8, 4, 3}, int64(0), []byte{8}, false, true, []byte{1, 7}, []byte{})
	f.Add("in", "uint8", []byte{8, 4, 3}, []byte{2, 4, 3}, int64(24), []byte{2}, false, true, []byte{1}, []byte{})
	f.Add("td/obs/x.memmap", "float32", []byte{8, 2}, []byte{8, 2}, int64(0), []byte{8}, false, true, []byte(nil), []byte{})
	f.Add("out", "uint8", []byte{16}, []byte{16}, int64(0), []byte{16}, false, true, []byte(nil), []byte{})
	f.Add("", "int16", []byte{}, []byte{3, 2}, int64(0), []byte{3}, true, false, []byte(nil), make([]byte, 12))
	f.Add("", "bool", []byte{}, []byte{0xff, 0}, int64(0), []byte{0xff}, true, false, []byte(nil), []byte{})
	f.Fuzz(func(t *testing.T, path, dtype string, file, shape []byte, off int64, batch []byte, gathered, byRef bool, rows, body []byte) {
		e := wireEntry{Key: []string{"x"}, Kind: kindTensor, DType: dtype, Shape: dims(shape)}
		if byRef {
			e.Ref = &wireRef{Path: path, File: dims(file), Offset: off}
		}
		w := &wireTD{Batch: dims(batch), Gathered: gathered, Out: true, Entries: []wireEntry{e}}
		if rows != nil {
			w.Rows = dims(rows)
		}
		td := &TD{wire: w}
		in := &incoming{method: "fuzz", body: &bodyReader{r: bytes.NewReader(body), n: int64(len(body))}, res: res}
		err := in.buildTDs([]*TD{td}, nil)
		defer in.release()
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == OK || e.Code == Unknown {
				t.Fatalf("buildTDs: %v, want an *Error with a code", err)
			}
			return
		}
		x, err := td.Tensor("x")
		if err != nil {
			t.Fatalf("built TD without its tensor: %v", err)
		}
		if mm, voff := x.Mapping(); mm != nil {
			real, err := filepath.EvalSymlinks(mm.Path())
			if err != nil {
				t.Fatal(err)
			}
			if rel, err := filepath.Rel(root, real); err != nil || !filepath.IsLocal(rel) {
				t.Fatalf("%q maps %s, outside the root", path, real)
			}
			if voff < 0 || voff+int64(x.NumBytes()) > int64(mm.NumBytes()) {
				t.Fatalf("a view of %d bytes at %d of a %d-byte file", x.NumBytes(), voff, mm.NumBytes())
			}
		}
		_, err = fill(context.Background(), FillRequest{TD: *td, Value: 3}, 1<<20)
		if c := CodeOf(err); c == Unknown || c == Internal {
			t.Fatalf("fill: %v", err)
		}
		_ = td.writeback()
	})
}

// FuzzServerStream sends a request built from the fuzzer's fields, or its
// raw bytes, on a stream of a live server over TCP, and checks that the
// server answers or closes the stream promptly. A panic anywhere in the
// server would end the fuzzing process.
func FuzzServerStream(f *testing.F) {
	root, _ := fuzzRoot(f)
	l := DefaultLimits()
	l.HandshakeTimeout = time.Second
	l.TransferGrace = time.Second
	l.MaxArgBytes = 1 << 16
	l.MaxBodyBytes = 1 << 20
	s, err := NewServer(WithRoot(root), WithLimits(l))
	if err != nil {
		f.Fatal(err)
	}
	if err := Register(s, methodEcho, func(ctx context.Context, m echoMsg) (echoMsg, error) { return m, nil }); err != nil {
		f.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go s.Serve(ln)
	f.Cleanup(func() { s.Close() })
	addr := ln.Addr().String()

	encode := func(v any) []byte {
		b, err := encodeMsgpack(v)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(false, methodEcho, encode(echoMsg{N: 1, S: "x"}), []byte{}, int8(0), int8(0), []byte{})
	seed := []int{8, 4, 3}
	f.Add(false, MethodFill, encode(&FillRequest{TD: TD{wire: refTD("td/memmap.memmap", "uint8", seed, seed, 0, []int{8}, []int{2})}, Value: 9}), []byte{}, int8(0), int8(0), []byte{})
	f.Add(false, MethodFill, encode(&FillRequest{TD: TD{wire: &wireTD{Batch: []int{2}, Out: true, Entries: []wireEntry{
		{Key: []string{"a"}, Kind: kindTensor, DType: "float32", Shape: []int{2, 2}}}}}, Value: 9}), make([]byte, 16), int8(0), int8(0), []byte{})
	f.Add(false, MethodRead, encode(&ReadRequest{Prefix: "td", Rows: []int{0, 7}}), []byte{}, int8(0), int8(0), []byte{})
	f.Add(false, MethodDescribe, encode(&DescribeRequest{Prefix: "td"}), []byte{}, int8(0), int8(0), []byte{})
	f.Add(false, MethodRead, encode(&ReadRequest{Prefix: "td"}), []byte{}, int8(0), int8(1), []byte{})
	f.Add(true, "", []byte{}, []byte{}, int8(0), int8(0), []byte{0, 0, 0, 3, 0x81, 0xa0, 0})

	var p *rawPeer // one connection for many inputs, until one breaks it
	f.Cleanup(func() {
		if p != nil {
			p.sess.Close()
		}
	})
	f.Fuzz(func(t *testing.T, raw bool, method string, args, body []byte, argDelta, bodyDelta int8, data []byte) {
		if p == nil || p.sess.IsClosed() {
			if p, err = newRawPeer(addr, nil); err != nil {
				t.Fatal(err)
			}
		}
		st, err := p.sess.OpenStream()
		if err != nil {
			t.Skip("session closed")
		}
		defer st.Close()
		var msg bytes.Buffer
		if raw {
			msg.Write(data)
		} else {
			bw := bufio.NewWriter(&msg)
			hdr := requestHeader{Method: method, ArgLen: int64(len(args)) + int64(argDelta), BodyLen: int64(len(body)) + int64(bodyDelta)}
			if err := writeFrame(bw, &hdr, args); err != nil {
				t.Fatal(err)
			}
			bw.Write(body)
			bw.Flush()
		}
		st.Write(msg.Bytes())
		st.Close() // the server sees the request end here
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.Copy(io.Discard, st)
		if errors.Is(err, yamux.ErrTimeout) {
			t.Fatalf("the server neither answered nor closed the stream in 10 s")
		}
	})
}

// TestReadHeader_AllocatesWithinLimit checks that a length prefix over the
// limit is refused before anything is allocated for it, and that a valid
// refusal costs a few small allocations, whatever the claim.
func TestReadHeader_AllocatesWithinLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"4 GB claimed", []byte{0xff, 0xff, 0xff, 0xff, 0x80}},
		{"just over the limit", []byte{0, 0, 0x10, 0x01, 0x80}},
	} {
		var err error
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 100 {
			var h requestHeader
			err = readHeader(bufio.NewReaderSize(bytes.NewReader(tc.in), 16), 4<<10, &h)
		}
		runtime.ReadMemStats(&after)
		if !errors.Is(err, errProtocol) {
			t.Errorf("%s: %v, want errProtocol", tc.name, err)
		}
		// Readers and the error message, never the claimed size.
		if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 4<<10 {
			t.Errorf("%s: %d bytes allocated per refused header", tc.name, per)
		}
	}
}
