package collective

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
)

// The rank protocol's golden bytes (docs/protocol.md, "Collective ranks"):
// the rendezvous and watch messages as rpc encodes them (go-msgpack, keys
// sorted), a call's description and a point-to-point message's first
// piece. A change here is a protocol change between ranks of different
// builds. (Python ranks do not speak this: their sidecars, Go ranks, do;
// docs/collective.md, "From Python".)

var wireHandle = &codec.MsgpackHandle{WriteExt: true}

func wireEncode(t *testing.T, v any) []byte {
	t.Helper()
	var b []byte
	if err := codec.NewEncoderBytes(&b, wireHandle).Encode(v); err != nil {
		t.Fatal(err)
	}
	return b
}

const goldenSession = 0x1234567890abcdef

var wireGolden = []struct {
	name string
	v    any    // a msgpack message, or
	raw  []byte // a binary one
	hex  string
}{
	{name: "collective.join request", v: joinReq{Rank: 1, Size: 4, Addr: "10.0.0.2:40001", Host: "b1c2", Dir: "/dev/shm"},
		hex: `86 a4 "addr" ae "10.0.0.2:40001" a3 "dir" a8 "/dev/shm" a4 "host" a4 "b1c2" a4 "rank" 01 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join response", v: joinResp{Session: goldenSession, Addrs: []string{"10.0.0.1:29500", "10.0.0.2:40001"}, Shm: "/dev/shm/tensorwire-collective-1234567890abcdef"},
		hex: `83 a5 "addrs" 92 ae "10.0.0.1:29500" ae "10.0.0.2:40001" a7 "session" cf 1234567890abcdef a3 "shm" d9 2f "/dev/shm/tensorwire-collective-1234567890abcdef"`},
	{name: "collective.ready request", v: readyReq{Session: goldenSession, Rank: 1},
		hex: `83 a3 "err" a0 a4 "rank" 01 a7 "session" cf 1234567890abcdef`},
	{name: "collective.ready response", v: readyResp{Shm: true},
		hex: `82 a3 "shm" c3 a3 "why" a0`},
	{name: "collective.watch request", v: watchReq{Session: goldenSession, Rank: 1},
		hex: `82 a4 "rank" 01 a7 "session" cf 1234567890abcdef`},
	{name: "collective.watch response", v: watchResp{Done: 5},
		hex: `81 a4 "done" 05`},
	{name: "collective.msg request, no bytes", v: msgReq{Session: goldenSession, Src: 2, Space: spaceData, Seq: 7, Step: 1},
		hex: `88 a4 "data" c0 a5 "piece" 00 a3 "seq" 07 a7 "session" cf 1234567890abcdef a5 "space" 02 a3 "src" 02 a4 "step" 01 a3 "tag" 00`},
	{name: "description, Allreduce(Sum) of float32 [2 3]",
		raw: (&desc{kind: kindAllreduce, op: Sum, dtype: memmap.Float32, hasT: true, shape: []int{2, 3}}).encode(nil),
		hex: `01 01 0c 01 00  00000000 00000000 00000000  0200 0200000000000000 0300000000000000  00000000  0000  0000`},
	{name: "description, Scatter of float64 [6 2] from root 1 in counts 1 2 3",
		raw: (&desc{kind: kindScatter, dtype: memmap.Float64, root: 1, hasT: true, shape: []int{6, 2}, counts: []int{1, 2, 3}}).encode(nil),
		hex: `06 00 0d 03 00  01000000 00000000 00000000  0200 0600000000000000 0200000000000000  03000000 0100000000000000 0200000000000000 0300000000000000  0000  0000`},
	{name: "point-to-point first piece, int64 [3]", raw: meta(memmap.Int64, []int{3}),
		hex: `06 0300000000000000`},
	// Hierarchical communicators (hier_*.go): the keys are left out when
	// false or empty, so the messages above are what ranks of builds
	// before them send.
	{name: "collective.join request, from a rank that can form a hierarchy", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true},
		hex: `87 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 1", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 1},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 01 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 2 (the pipelined shared-mapping reduction)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 2},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 02 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 3 (the hierarchy's Bcast and Allgather by levels)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 3},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 03 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 4 (the hierarchy's Reduce and ReduceScatter by levels)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 4},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 04 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 5 (the hierarchy's Gather, Scatter and Alltoall by levels)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 5},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 05 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 6 (point-to-point by reference through the shared folder)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 6},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 06 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 7 (an Allreduce of shared buffers in place)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 7},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 07 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 8 (point-to-point of a shared buffer by a reference to it)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 8},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 08 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, protocol 9 (point-to-point notes through the receiver's inbox)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: 9},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 09 a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.join request, this build's (protocol 10: a small point-to-point message whole, in one call)", v: joinReq{Rank: 3, Size: 4, Addr: "10.0.0.3:40002", Host: "b2c3", Dir: "/dev/shm", Hier: true, Proto: protoVersion},
		hex: `88 a4 "addr" ae "10.0.0.3:40002" a3 "dir" a8 "/dev/shm" a4 "hier" c3 a4 "host" a4 "b2c3" a5 "proto" 0a a4 "rank" 03 a4 "size" 04 a9 "transport" a0`},
	{name: "collective.msg request, point-to-point by reference (its header; the dtype and shape go as its data)", v: msgReq{Session: goldenSession, Src: 1, Space: spaceP2P, Seq: 2, Tag: 9,
		Ref: &p2pRef{Gen: 1, ID: 7, Len: 1 << 20, Off: 4096, Size: 4 << 20}},
		hex: `89 a4 "data" c0 a5 "piece" 00 a3 "ref" 85 a3 "gen" 01 a2 "id" 07 a3 "len" ce 00100000 a3 "off" cd 1000 a4 "size" ce 00400000 a3 "seq" 02 a7 "session" cf 1234567890abcdef a5 "space" 03 a3 "src" 01 a4 "step" 00 a3 "tag" 09`},
	{name: "collective.msg request, point-to-point of a shared buffer (protocol 8: its bytes at off of the sender's rank-1.s2, the region the header alone)", v: msgReq{Session: goldenSession, Src: 1, Space: spaceP2P, Seq: 3, Tag: 9,
		Ref: &p2pRef{Buf: &p2pBuf{Idx: 2, Len: 1 << 20, Off: 8192}, Gen: 1, ID: 8, Off: 8192, Size: 4 << 20}},
		hex: `89 a4 "data" c0 a5 "piece" 00 a3 "ref" 86 a3 "buf" 83 a3 "idx" 02 a3 "len" ce 00100000 a3 "off" cd 2000 a3 "gen" 01 a2 "id" 08 a3 "len" 00 a3 "off" cd 2000 a4 "size" ce 00400000 a3 "seq" 03 a7 "session" cf 1234567890abcdef a5 "space" 03 a3 "src" 01 a4 "step" 00 a3 "tag" 09`},
	{name: "collective.join response, a hierarchy of two hosts proposed", v: joinResp{Session: goldenSession, Addrs: []string{"a:1", "a:2", "b:1", "b:2"}, Hosts: []int{0, 0, 1, 1}, Hier: true},
		hex: `85 a5 "addrs" 94 a3 "a:1" a3 "a:2" a3 "b:1" a3 "b:2" a4 "hier" c3 a5 "hosts" 94 00 00 01 01 a7 "session" cf 1234567890abcdef a3 "shm" a0`},
	{name: "collective.ready response, hierarchical", v: readyResp{Hier: true},
		hex: `83 a4 "hier" c3 a3 "shm" c2 a3 "why" a0`},
	// Inboxes (protocol 9, p2p_inbox.go): an entry of a sender's ring in the
	// receiver's inbox file, to the end of its first piece, and an
	// answer's fields.
	{name: "inbox entry, posted (2nd use): message 2 with tag 9 by reference, float32 [2 3]",
		raw: inboxGoldenEntry(msgKey{seq: 2, tag: 9}, meta(memmap.Float32, []int{2, 3}), &p2pRef{Gen: 1, ID: 7, Len: 24, Off: 4096, Size: 4 << 20}, 2<<3|entryPosted),
		hex: `11000000 00000000  0200000000000000  0900000000000000  01000000 00000000  0700000000000000  1800000000000000  0010000000000000  0000400000000000  00000000 11000000  0000000000000000  0000000000000000  0c 0200000000000000 0300000000000000`},
	{name: "inbox entry, posted: a shared buffer's message, its bytes at 8192 of the sender's s2, int64 [3]",
		raw: inboxGoldenEntry(msgKey{seq: 3, tag: 9}, meta(memmap.Int64, []int{3}), &p2pRef{Buf: &p2pBuf{Idx: 2, Len: 24, Off: 8192}, Gen: 1, ID: 8, Off: 8192, Size: 4 << 20}, 1<<3|entryPosted),
		hex: `09000000 00000000  0300000000000000  0900000000000000  01000000 01000000  0800000000000000  0000000000000000  0020000000000000  0000400000000000  02000000 09000000  1800000000000000  0020000000000000  06 0300000000000000`},
	{name: "inbox answer: ErrMismatch",
		raw: inboxGoldenAnswer(&rpc.Error{Code: rpc.InvalidArgument, Reason: "collective.mismatch", Msg: "collective: ranks disagree: float32 [4] to float32 [8]"}),
		hex: `03000000 1300 3600 "collective.mismatch" "collective: ranks disagree: float32 [4] to float32 [8]"`},
	{name: "inbox answer: none (the message was taken)", raw: inboxGoldenAnswer(nil),
		hex: `00000000 0000 0000`},
}

// inboxGoldenEntry is an entry of the golden inbox, in state st, up to the
// end of its first piece m.
func inboxGoldenEntry(k msgKey, m []byte, ref *p2pRef, st uint32) []byte {
	e := make([]byte, inboxEntry)
	encodeEntry(e, k, m, ref)
	binary.LittleEndian.PutUint32(e[beState:], st)
	return e[:beMeta+len(m)]
}

// inboxGoldenAnswer is the answer fields of an entry answered with err.
func inboxGoldenAnswer(err error) []byte {
	b := make([]byte, inboxEntry)
	m := shm.Over(b)
	answerEntry(m, 0, 1<<3, err)
	rl, ml := int(binary.LittleEndian.Uint16(b[beReason:])), int(binary.LittleEndian.Uint16(b[beMsg:]))
	return b[beCode : beText+rl+ml]
}

func TestWire_Golden(t *testing.T) {
	for _, g := range wireGolden {
		got := g.raw
		if g.v != nil {
			got = wireEncode(t, g.v)
		}
		if want := svctest.Unhex(t, g.hex); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", g.name, got, want)
		}
		if g.v != nil {
			back := reflect.New(reflect.TypeOf(g.v))
			if err := codec.NewDecoderBytes(got, wireHandle).Decode(back.Interface()); err != nil || !reflect.DeepEqual(back.Elem().Interface(), g.v) {
				t.Errorf("%s: decodes to %+v, %v", g.name, back.Elem().Interface(), err)
			}
		}
	}
	d, err := decodeDesc(wireGolden[8].raw)
	if err != nil || d.kind != kindScatter || d.root != 1 || !reflect.DeepEqual(d.counts, []int{1, 2, 3}) {
		t.Errorf("decodeDesc = %+v, %v", d, err)
	}
}

// TestWire_ProtocolDoc: docs/protocol.md shows these bytes.
func TestWire_ProtocolDoc(t *testing.T) {
	text, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(text), "<!-- begin collective rank messages -->\n```\n")
	block, _, ok2 := strings.Cut(rest, "```\n<!-- end collective rank messages -->")
	if !ok || !ok2 {
		t.Fatal("docs/protocol.md has no fenced block of collective rank messages")
	}
	names, msgs := svctest.ParseGolden(t, block)
	if len(names) != len(wireGolden) {
		t.Fatalf("docs/protocol.md shows %d messages, want %d", len(names), len(wireGolden))
	}
	for i, g := range wireGolden {
		if names[i] != g.name || !bytes.Equal(msgs[names[i]], svctest.Unhex(t, g.hex)) {
			t.Errorf("docs/protocol.md shows %q as %s, want %q %s", names[i], hex.EncodeToString(msgs[names[i]]), g.name, g.hex)
		}
	}
}
