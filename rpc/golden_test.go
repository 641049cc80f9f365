package rpc

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The golden tests pin the wire format byte for byte: docs/protocol.md
// describes these bytes, and a peer built from that page must interoperate.
// A change here is a protocol change: bump ProtocolVersion and say so in
// the doc.

// unhex decodes a hex string that may contain spaces and newlines.
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// goldenHello is a version 1 hello; version 2's differs in the version
// byte alone (TestGolden_Hello).
func goldenHello() hello {
	h := hello{version: 1, flags: flagToken}
	for i := range h.nonce {
		h.nonce[i] = byte(i)
	}
	for i := range h.fsid {
		h.fsid[i] = 0xa0 + byte(i)
	}
	return h
}

func TestGolden_Hello(t *testing.T) {
	h := goldenHello()
	want := unhex(t, `
		54575250 01 01 0000
		000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
		a0a1a2a3a4a5a6a7a8a9aaabacadaeaf
		0000000000000000`)
	got := h.marshal()
	if !bytes.Equal(got, want) {
		t.Fatalf("hello\n got %x\nwant %x", got, want)
	}
	back, err := parseHello(want)
	if err != nil || back != h {
		t.Fatalf("parseHello = %+v, %v", back, err)
	}

	h.version, h.flags = 2, 0
	want = unhex(t, `
		54575250 02 00 0000
		000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
		a0a1a2a3a4a5a6a7a8a9aaabacadaeaf
		0000000000000000`)
	if got := h.marshal(); !bytes.Equal(got, want) {
		t.Fatalf("version 2 hello\n got %x\nwant %x", got, want)
	}
}

func TestGolden_Proof(t *testing.T) {
	c := goldenHello().marshal()
	sh := goldenHello()
	sh.flags = flagToken
	sh.nonce[0] = 0xff
	s := sh.marshal()
	token := []byte("secret")
	for _, tc := range []struct {
		label []byte
		want  string
	}{
		// HMAC-SHA256(token, label || client hello || server hello), computed
		// independently with Python's hmac module.
		{clientProofLabel, "306ff1061344549ca480bad7264e192ac43e4f4010a1ebd9d2957234ebfd01ee"},
		{serverProofLabel, "b7aa7ac2bd5d596e7244fe21d8bc6a2c29771c2f893bb67246b0c8e1927d592f"},
	} {
		got := hex.EncodeToString(proof(token, tc.label, c, s))
		if got != tc.want {
			t.Errorf("proof(%q)\n got %s\nwant %s", tc.label, got, tc.want)
		}
	}
}

func TestGolden_Status(t *testing.T) {
	for _, tc := range []struct {
		code Code
		msg  string
		want string
	}{
		{OK, "", "00"},
		{Unauthenticated, "wrong token", "10 000b 77726f6e6720746f6b656e"},
	} {
		var buf bytes.Buffer
		if err := writeStatus(&buf, tc.code, tc.msg); err != nil {
			t.Fatal(err)
		}
		if want := unhex(t, tc.want); !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("status %v\n got %x\nwant %x", tc.code, buf.Bytes(), want)
		}
	}
}

func TestGolden_Messages(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  header
		args []byte
		want string
	}{
		{
			"request",
			&requestHeader{Method: "tensorwire.fill", TimeoutUS: 5_000_000, ArgLen: 3},
			[]byte{1, 2, 3},
			`0000003b
			 84
			 a7 6172675f6c656e 03
			 a8 626f64795f6c656e 00
			 a6 6d6574686f64 af 74656e736f72776972652e66696c6c
			 aa 74696d656f75745f7573 d2 004c4b40
			 010203`,
		},
		{
			"error response",
			&responseHeader{Code: uint8(InvalidArgument), Message: "bad"},
			nil,
			`00000026
			 84
			 a7 6172675f6c656e 00
			 a8 626f64795f6c656e 00
			 a4 636f6465 03
			 a7 6d657373616765 a3 626164`,
		},
		{
			"error response with a reason",
			&responseHeader{Code: uint8(Aborted), Message: "expired", Reason: "replay.expired"},
			nil,
			`00000040
			 85
			 a7 6172675f6c656e 00
			 a8 626f64795f6c656e 00
			 a4 636f6465 0a
			 a7 6d657373616765 a7 65787069726564
			 a6 726561736f6e ae 7265706c61792e65787069726564`,
		},
	} {
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		if err := writeFrame(w, tc.hdr, tc.args); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		if want := unhex(t, tc.want); !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%s\n got %x\nwant %x", tc.name, buf.Bytes(), want)
		}
	}
}

// TestGolden_FillByReference pins the argument of the seed's remote fill:
// a 1.2 GB TensorDict travels as these 186 bytes.
func TestGolden_FillByReference(t *testing.T) {
	req := FillRequest{Value: 1, TD: TD{wire: &wireTD{
		Batch: []int{1000}, Rows: []int{0, 999}, Out: true,
		Entries: []wireEntry{{
			Key: []string{"memmap"}, Kind: kindTensor, DType: "torch.uint8", Shape: []int{1000, 640, 640, 3},
			Ref: &wireRef{Path: "td/memmap.memmap", File: []int{1000, 640, 640, 3}},
		}},
	}}}
	want := unhex(t, `
		83
		a3 737263 c0
		a2 7464 85
		  a5 6261746368 91 d103e8
		  a7 656e7472696573 91 86
		    a4 64617461 c0
		    a5 6474797065 ab 746f7263682e75696e7438
		    a3 6b6579 91 a6 6d656d6d6170
		    a4 6b696e64 a6 74656e736f72
		    a3 726566 83
		      a4 66696c65 94 d103e8 d10280 d10280 03
		      a6 6f6666736574 00
		      a4 70617468 b0 74642f6d656d6d61702e6d656d6d6170
		    a5 7368617065 94 d103e8 d10280 d10280 03
		  a8 6761746865726564 c2
		  a3 6f7574 c3
		  a4 726f7773 92 00 d103e7
		a5 76616c7565 cb 3ff0000000000000`)
	got, err := encodeMsgpack(&req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("fill request\n got %x\nwant %x", got, want)
	}
	var back FillRequest
	if err := decodeMsgpack(want, &back); err != nil {
		t.Fatal(err)
	}
	if w := back.TD.wire; w == nil || len(w.Entries) != 1 || w.Entries[0].Ref.Path != "td/memmap.memmap" || back.Value != 1 || back.Src != nil {
		t.Fatalf("decoded %+v", back)
	}
}

// TestGolden_Describe pins a schema on the wire: each field a map whose
// dtype is a msgpack str holding the torch name (docs/protocol.md).
func TestGolden_Describe(t *testing.T) {
	resp := DescribeResponse{Batch: []int{70000}, Bytes: 56000000, Fields: []tensordict.Field{
		{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{70000, 28, 28}},
		{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{70000}},
	}}
	want := unhex(t, `
		83
		a5 6261746368 91 d200011170
		a5 6279746573 d203567e00
		a6 6669656c6473 92
		  83
		    a5 6474797065 ab 746f7263682e75696e7438
		    a3 6b6579 91 a6 696d61676573
		    a5 7368617065 93 d200011170 1c 1c
		  83
		    a5 6474797065 ab 746f7263682e696e743634
		    a3 6b6579 91 a6 6c6162656c73
		    a5 7368617065 91 d200011170`)
	got, err := encodeMsgpack(&resp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("describe response\n got %x\nwant %x", got, want)
	}
	var back DescribeResponse
	if err := decodeMsgpack(want, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, resp) {
		t.Fatalf("decoded %+v, want %+v", back, resp)
	}
}

// TestHeader_MatchesGoMsgpack checks the hand-written header codec against
// go-msgpack on the same structs: same bytes out, and go-msgpack's bytes
// (and other valid encodings) read back.
func TestHeader_MatchesGoMsgpack(t *testing.T) {
	reqs := []requestHeader{
		{},
		{Method: "m", TimeoutUS: 1, ArgLen: 127, BodyLen: 128},
		{Method: strings.Repeat("x", 40), TimeoutUS: 1 << 40, ArgLen: 70000, BodyLen: -1},
		{Method: strings.Repeat("y", 300), TimeoutUS: -200, ArgLen: 255, BodyLen: 1 << 33},
		{Method: "s", TimeoutUS: 9, ArgLen: 3, BodyLen: 40, RawLen: 7000, Stream: true, NoLZ4: true},
		{Method: "s", ArgLen: 3, Stream: true},
		{Method: "c", ArgLen: 3, BodyLen: 40, RawLen: 1 << 20},
		{Method: "b", ArgLen: 3, BodyLen: 1 << 22, Side: 7, SideBody: true},
		{Method: "r", TimeoutUS: 9, ArgLen: 3, RawLen: 1 << 20, BodyLen: 9000, Side: 1 << 31, Stream: true, NoLZ4: true},
	}
	for _, h := range reqs {
		want, err := encodeMsgpack(&h)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.appendMsgpack(nil); !bytes.Equal(got, want) {
			t.Errorf("%+v\n got %x\nwant %x", h, got, want)
		}
		var back requestHeader
		if err := back.decodeMsgpack(want); err != nil || back != h {
			t.Errorf("decode %x = %+v, %v", want, back, err)
		}
	}
	for _, resp := range []responseHeader{
		{Code: 16, Message: "no", ArgLen: 3, BodyLen: 4},
		{Code: 10, Message: "expired", Reason: "replay.expired"},
		{Code: 5, Message: strings.Repeat("m", 40), Reason: strings.Repeat("r", 64)},
		{ArgLen: 10, BodyLen: 300, RawLen: 90000},
	} {
		want, err := encodeMsgpack(&resp)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.appendMsgpack(nil); !bytes.Equal(got, want) {
			t.Errorf("response %+v\n got %x\nwant %x", resp, got, want)
		}
		var back responseHeader
		if err := back.decodeMsgpack(want); err != nil || back != resp {
			t.Errorf("decode %x = %+v, %v", want, back, err)
		}
	}
	// A response written by another implementation: the reason first, as
	// str8, and an unknown key after it.
	otherResp := unhex(t, `86
		a6 726561736f6e d9 02 782e
		a4 636f6465 cc 05
		a7 6d657373616765 a0
		a5 6c61746572 81 a1 6b c0
		a8 626f64795f6c656e 00
		a7 6172675f6c656e 00`)
	var rh responseHeader
	if err := rh.decodeMsgpack(otherResp); err != nil || rh != (responseHeader{Code: 5, Reason: "x."}) {
		t.Fatalf("decoded %+v, %v", rh, err)
	}
	// Keys in another order, unsigned and wide integers, an unknown key
	// with a nested value: all valid, as another implementation may write.
	other := unhex(t, `85
		a6 6d6574686f64 d9 01 6d
		a7 756e6b6e6f776e 92 c3 a1 78
		aa 74696d656f75745f7573 cf 0000000000000005
		a7 6172675f6c656e cc ff
		a8 626f64795f6c656e cd 0100`)
	var h requestHeader
	if err := h.decodeMsgpack(other); err != nil || h != (requestHeader{Method: "m", TimeoutUS: 5, ArgLen: 255, BodyLen: 256}) {
		t.Fatalf("decoded %+v, %v", h, err)
	}
	for _, bad := range []string{"", "80 00", "93 00 00 00", "81 a1 78", "81 01 02", "81 a7 6172675f6c656e a1 78", "81 a7 6172675f6c656e cf ffffffffffffffff"} {
		var h requestHeader
		if err := h.decodeMsgpack(unhex(t, bad)); err == nil {
			t.Errorf("decoded %q without an error: %+v", bad, h)
		}
	}
}

// TestHeader_Allocs pins what message headers cost on every call's path:
// writing one allocates nothing, reading one only the strings it keeps.
func TestHeader_Allocs(t *testing.T) {
	hdr := &requestHeader{Method: MethodFill, TimeoutUS: 5_000_000, ArgLen: 100, BodyLen: 1 << 20}
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	write := func() {
		buf.Reset()
		if err := writeFrame(w, hdr, nil); err != nil {
			t.Fatal(err)
		}
		w.Flush()
	}
	if n := testing.AllocsPerRun(100, write); n != 0 {
		t.Errorf("writing a request header: %v allocations", n)
	}
	frame := bytes.Clone(buf.Bytes())
	src := bytes.NewReader(frame)
	r := bufio.NewReader(src)
	var got requestHeader
	read := func() {
		src.Reset(frame)
		r.Reset(src)
		if err := readHeader(r, 64<<10, &got); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(100, read); n != 1 {
		t.Errorf("reading a request header: %v allocations, want 1 (its method)", n)
	}
	if got != *hdr {
		t.Fatalf("read %+v, wrote %+v", got, *hdr)
	}

	// An error response with a reason: the same, with two strings kept.
	resp := &responseHeader{Code: uint8(Aborted), Message: "replay: reservation expired", Reason: "replay.expired"}
	writeResp := func() {
		buf.Reset()
		if err := writeFrame(w, resp, nil); err != nil {
			t.Fatal(err)
		}
		w.Flush()
	}
	if n := testing.AllocsPerRun(100, writeResp); n != 0 {
		t.Errorf("writing a response header with a reason: %v allocations", n)
	}
	frame = bytes.Clone(buf.Bytes())
	var gotResp responseHeader
	readResp := func() {
		src.Reset(frame)
		r.Reset(src)
		if err := readHeader(r, 64<<10, &gotResp); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(100, readResp); n != 2 {
		t.Errorf("reading a response header with a reason: %v allocations, want 2 (its message and reason)", n)
	}
	if gotResp != *resp {
		t.Fatalf("read %+v, wrote %+v", gotResp, *resp)
	}
}

// TestGolden_Version2 pins what version 2 adds: a request that opens a
// message stream, compressed bodies' raw_len, and the frames of a stream.
func TestGolden_Version2(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  header
		args []byte
		want string
	}{
		{
			"stream opening request, answers uncompressed",
			&requestHeader{Method: "store.watch", TimeoutUS: 0, ArgLen: 1, Stream: true, NoLZ4: true},
			[]byte{0x80},
			`00000049
			 86
			 a7 6172675f6c656e 01
			 a8 626f64795f6c656e 00
			 a6 6d6574686f64 ab 73746f72652e7761746368
			 a6 73747265616d c3
			 aa 74696d656f75745f7573 00
			 ac 756e636f6d70726573736564 c3
			 80`,
		},
		{
			"request with a compressed body",
			&requestHeader{Method: "tensorwire.fill", TimeoutUS: 5_000_000, ArgLen: 3, BodyLen: 4000, RawLen: 6_144_000},
			[]byte{1, 2, 3},
			`0000004a
			 85
			 a7 6172675f6c656e 03
			 a8 626f64795f6c656e d1 0fa0
			 a6 6d6574686f64 af 74656e736f72776972652e66696c6c
			 a7 7261775f6c656e d2 005dc000
			 aa 74696d656f75745f7573 d2 004c4b40
			 010203`,
		},
		{
			"response with a compressed body",
			&responseHeader{ArgLen: 1, BodyLen: 300, RawLen: 90000},
			[]byte{0x80},
			`00000032
			 85
			 a7 6172675f6c656e 01
			 a8 626f64795f6c656e d1 012c
			 a4 636f6465 00
			 a7 6d657373616765 a0
			 a7 7261775f6c656e d2 00015f90
			 80`,
		},
		{
			"stream message",
			&streamHeader{ArgLen: 2, BodyLen: 28224},
			[]byte{0x81, 0x01},
			`00000016
			 82
			 a7 6172675f6c656e 02
			 a8 626f64795f6c656e d1 6e40
			 8101`,
		},
		{
			"stream message, compressed",
			&streamHeader{ArgLen: 2, BodyLen: 500, RawLen: 28224},
			[]byte{0x81, 0x01},
			`00000021
			 83
			 a7 6172675f6c656e 02
			 a8 626f64795f6c656e d1 01f4
			 a7 7261775f6c656e d1 6e40
			 8101`,
		},
		{
			"stream end",
			&streamHeader{End: true},
			nil,
			`00000015
			 83
			 a4 636f6465 00
			 a3 656e64 c3
			 a7 6d657373616765 a0`,
		},
		{
			"stream end with an error and a reason",
			&streamHeader{End: true, Code: uint8(Aborted), Message: "expired", Reason: "replay.expired"},
			nil,
			`00000032
			 84
			 a4 636f6465 0a
			 a3 656e64 c3
			 a7 6d657373616765 a7 65787069726564
			 a6 726561736f6e ae 7265706c61792e65787069726564`,
		},
	} {
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		if err := writeFrame(w, tc.hdr, tc.args); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		want := unhex(t, tc.want)
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%s\n got %x\nwant %x", tc.name, buf.Bytes(), want)
			continue
		}
		// And it reads back.
		back := reflect.New(reflect.TypeOf(tc.hdr).Elem()).Interface().(header)
		if err := readHeader(bufio.NewReader(bytes.NewReader(want)), 64<<10, back); err != nil || !reflect.DeepEqual(back, tc.hdr) {
			t.Errorf("%s: read back %+v, %v", tc.name, back, err)
		}
	}
	// Frames of another writer: keys in any order, unknown keys skipped;
	// and frames that mix the two kinds are refused.
	for _, tc := range []struct {
		in   string
		want streamHeader
		ok   bool
	}{
		{"83 a3 656e64 c3 a4 636f6465 cc 05 a5 6c61746572 90", streamHeader{End: true, Code: 5}, true},
		{"82 a8 626f64795f6c656e cd 0100 a7 6172675f6c656e 01", streamHeader{ArgLen: 1, BodyLen: 256}, true},
		{"82 a3 656e64 c3 a7 6172675f6c656e 01", streamHeader{}, false},
		{"82 a7 6172675f6c656e 01 a4 636f6465 03", streamHeader{}, false},
		{"81 a3 656e64 01", streamHeader{}, false},
	} {
		var h streamHeader
		err := h.decodeMsgpack(unhex(t, tc.in))
		if (err == nil) != tc.ok || tc.ok && h != tc.want {
			t.Errorf("%s: %+v, %v", tc.in, h, err)
		}
	}
}

// TestGolden_Version3 pins what version 3 adds: the attach flag of a side
// connection's hello, the session message, the attach message, and the
// side connection keys of message headers, and a call's request on a side
// connection (its tag, then the request).
func TestGolden_Version3(t *testing.T) {
	h := goldenHello()
	h.version, h.flags = 3, flagToken|flagAttach
	want := unhex(t, `
		54575250 03 03 0000
		000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
		a0a1a2a3a4a5a6a7a8a9aaabacadaeaf
		0000000000000000`)
	if got := h.marshal(); !bytes.Equal(got, want) {
		t.Fatalf("side connection's hello\n got %x\nwant %x", got, want)
	}
	if back, err := parseHello(want); err != nil || back != h {
		t.Fatalf("parseHello = %+v, %v", back, err)
	}
	// The attach flag is unknown before version 3.
	want[4] = 2
	if _, err := parseHello(want); !errors.Is(err, errHandshake) {
		t.Fatalf("a version 2 hello with the attach flag: %v", err)
	}

	var secret [32]byte
	for i := range secret {
		secret[i] = byte(i)
	}
	sess := sessionMsg{secret: secret, max: 8}
	want = unhex(t, `000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0008 000000000000`)
	if got := sess.marshal(); !bytes.Equal(got, want) {
		t.Fatalf("session message\n got %x\nwant %x", got, want)
	}
	if back, err := parseSession(want); err != nil || back != sess {
		t.Fatalf("parseSession = %+v, %v", back, err)
	}
	att := attachMsg{id: 1, secret: secret}
	want = unhex(t, `00000001 00000000 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f`)
	if got := att.marshal(); !bytes.Equal(got, want) {
		t.Fatalf("attach message\n got %x\nwant %x", got, want)
	}
	if back, err := parseAttach(want); err != nil || back != att {
		t.Fatalf("parseAttach = %+v, %v", back, err)
	}

	for _, tc := range []struct {
		name string
		hdr  header
		want string
	}{
		{
			"request whose body is on side connection 1",
			&requestHeader{Method: "bulk", ArgLen: 3, BodyLen: 6_144_000, Side: 1, SideBody: true},
			`00000041
			 86
			 a7 6172675f6c656e 03
			 a8 626f64795f6c656e d2 005dc000
			 a6 6d6574686f64 a4 62756c6b
			 a4 73696465 01
			 a9 736964655f626f6479 c3
			 aa 74696d656f75745f7573 00`,
		},
		{
			"request holding side connection 2 for its answer",
			&requestHeader{Method: "tensorwire.read", TimeoutUS: 5_000_000, ArgLen: 1, Side: 2},
			`00000041
			 85
			 a7 6172675f6c656e 01
			 a8 626f64795f6c656e 00
			 a6 6d6574686f64 af 74656e736f72776972652e72656164
			 a4 73696465 02
			 aa 74696d656f75745f7573 d2 004c4b40`,
		},
	} {
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		if err := writeFrame(w, tc.hdr, nil); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		want := unhex(t, tc.want)
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%s\n got %x\nwant %x", tc.name, buf.Bytes(), want)
			continue
		}
		back := reflect.New(reflect.TypeOf(tc.hdr).Elem()).Interface().(header)
		if err := readHeader(bufio.NewReader(bytes.NewReader(want)), 64<<10, back); err != nil || !reflect.DeepEqual(back, tc.hdr) {
			t.Errorf("%s: read back %+v, %v", tc.name, back, err)
		}
	}
	// A call's request on a side connection: the call's tag, then the
	// request as in a stream (here with a 1-byte argument and no body).
	var buf bytes.Buffer
	if err := writeTagged(&buf, true, &requestHeader{Method: "bulk", ArgLen: 1}, []byte{0x80}, nil); err != nil {
		t.Fatal(err)
	}
	want = unhex(t, `ff
		0000002c
		84
		a7 6172675f6c656e 01
		a8 626f64795f6c656e 00
		a6 6d6574686f64 a4 62756c6b
		aa 74696d656f75745f7573 00
		80`)
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("a call's request on a side connection\n got %x\nwant %x", buf.Bytes(), want)
	}
	// The side keys are refused outside version 3, and malformed in it.
	for _, tc := range []struct {
		side     int64
		sideBody bool
		version  uint8
		ok       bool
	}{
		{0, false, 2, true}, {1, false, 3, true}, {1, true, 3, true}, {1<<32 - 1, true, 3, true},
		{1, false, 2, false}, {0, true, 3, false}, {-1, false, 3, false}, {1 << 32, false, 3, false},
	} {
		if err := checkSide(tc.side, tc.sideBody, tc.version); (err == nil) != tc.ok || err != nil && !errors.Is(err, errProtocol) {
			t.Errorf("checkSide(%d, %v, %d) = %v", tc.side, tc.sideBody, tc.version, err)
		}
	}
}
