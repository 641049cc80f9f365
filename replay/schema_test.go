package replay

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestMeta_RewritesAnOlderFileByteForByte reads a replay.json written by
// an earlier version of this package (testdata/replay.json: a given schema
// with nested keys, a null and an empty per-transition shape, a prioritized
// sampler, a top-k writer, a rate limit, a checkpoint) and writes it back
// from the configuration it parsed: the file's format does not drift.
func TestMeta_RewritesAnOlderFileByteForByte(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "replay.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, cfg, err := parseMeta(data)
	if err != nil {
		t.Fatal(err)
	}
	got, err := encodeMeta(m.ID, cfg, cfg.Schema, m.RIDLimit, m.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("rewritten replay.json differs:\n%s\nwant\n%s", got, data)
	}
}

// wireHandle encodes as rpc does (rpc/wire.go's handle: msgpack with the
// str8 and bin types of the current spec).
var wireHandle = &codec.MsgpackHandle{WriteExt: true}

// TestWire_SchemaBytes pins a transition schema on the wire
// (docs/protocol.md): each field a map whose dtype is a msgpack str
// holding the torch name.
func TestWire_SchemaBytes(t *testing.T) {
	req := reserveRequest{Name: "buf", N: 2, Schema: tensordict.RowSchema{
		{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{4, 4}},
		{Key: []string{"next", "reward"}, DType: memmap.Float32, Shape: []int{}},
		{Key: []string{"action"}, DType: memmap.Int64},
	}}
	want, err := hex.DecodeString(strings.Join(strings.Fields(`
		84
		a4 6b657973 c0
		a1 6e 02
		a4 6e616d65 a3 627566
		a6 736368656d61 93
		  83
		    a5 6474797065 ab 746f7263682e75696e7438
		    a3 6b6579 91 a3 6f6273
		    a5 7368617065 92 04 04
		  83
		    a5 6474797065 ad 746f7263682e666c6f61743332
		    a3 6b6579 92 a4 6e657874 a6 726577617264
		    a5 7368617065 90
		  83
		    a5 6474797065 ab 746f7263682e696e743634
		    a3 6b6579 91 a6 616374696f6e
		    a5 7368617065 c0`), ""))
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := codec.NewEncoderBytes(&got, wireHandle).Encode(&req); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("reserve request\n got %x\nwant %x", got, want)
	}
	var back reserveRequest
	if err := codec.NewDecoderBytes(want, wireHandle).Decode(&back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, req) {
		t.Fatalf("decoded %+v, want %+v", back, req)
	}
}
