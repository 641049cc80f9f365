package replay

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"

	"github.com/tensorwire/tensorwire/rpc"
)

// controlsGolden are the messages of replay.delete and replay.reset, as
// testdata/wire/controls.hex pins them (python/tests/test_replay_seq_golden.py
// checks the same bytes from Python; docs/protocol.md shows them).
var controlsGolden = []struct {
	name string
	msg  any
}{
	{"replay.delete request", deleteRequest{Name: "buf", Info: SampleInfo{Indices: []int{3, 5}, IDs: []uint64{7, 9}, Weights: []float64{}}}},
	{"replay.delete request, by index", deleteRequest{Name: "buf", Info: SampleInfo{Indices: []int{3}, Weights: []float64{}}}},
	{"replay.delete response", deleteResponse{Deleted: 1}},
	{"replay.reset request", nameRequest{Name: "buf"}},
	{"replay.reset response", rpc.Empty{}},
	{"replay.sample_slices request", slicesRequest{Name: "buf", Bytes: true, SliceLen: 2, NumSlices: 2, PadShort: true, Prioritized: true}},
	{"replay.sample_slices response, rows left out", slicesResponse{ID: "9f3c0a7d12e4b5a6",
		Info:     SampleInfo{Indices: []int{4, 5, 9, -1}, IDs: []uint64{1, 1, 2, 0}, Weights: []float64{1, 1, 1, 1}},
		Mask:     []bool{true, true, true, false},
		Episodes: []int64{7, 8}}},
	{"replay.sample_slices request, packed", slicesRequest{Name: "buf", SliceLen: 2, NumSlices: 2, PadShort: true, Prioritized: true, Packed: true}},
	{"replay.sample_slices response, packed picks", slicesResponse{ID: "9f3c0a7d12e4b5a6",
		Picks: []byte{4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
			9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0},
		PickWeights: []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0xe0, 0x3f, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f},
		Episodes:    []int64{7, 8}}},
}

// readGoldenFile reads a "# NAME" then hex file into {name: bytes}.
func readGoldenFile(t *testing.T, path string) map[string][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	var name string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(line, "# "); ok {
			name = n
			continue
		}
		b, err := hex.DecodeString(line)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out[name] = append(out[name], b...)
	}
	return out
}

// TestWire_GoldenControls: replay.delete's and replay.reset's messages keep
// their bytes, and decode back to what they were.
func TestWire_GoldenControls(t *testing.T) {
	path := filepath.Join("testdata", "wire", "controls.hex")
	if os.Getenv("TENSORWIRE_WRITE_GOLDEN") != "" {
		var b strings.Builder
		for _, g := range controlsGolden {
			b.WriteString("# " + g.name + "\n" + hex.EncodeToString(encodeGolden(t, g.msg)) + "\n")
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := readGoldenFile(t, path)
	for _, g := range controlsGolden {
		got := encodeGolden(t, g.msg)
		if !bytes.Equal(got, want[g.name]) {
			t.Errorf("%s encoded as\n%x\nwant\n%x", g.name, got, want[g.name])
		}
		back := reflect.New(reflect.TypeOf(g.msg))
		if err := codec.NewDecoderBytes(want[g.name], msgpackHandle).Decode(back.Interface()); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back.Elem().Interface(), g.msg) {
			t.Errorf("%s decoded as %+v, want %+v", g.name, back.Elem().Interface(), g.msg)
		}
	}
	// The node answers the golden requests.
	b := create(t, Config{Capacity: 8})
	extend(t, b, 0, 1, 2, 3, 4, 5)
	svc := serveAt(t, b, "x")
	var del deleteRequest
	if err := codec.NewDecoderBytes(want["replay.delete request, by index"], msgpackHandle).Decode(&del); err != nil {
		t.Fatal(err)
	}
	if resp, err := svc.delete(context.Background(), del); err != nil || !bytes.Equal(encodeGolden(t, resp), want["replay.delete response"]) {
		t.Fatalf("delete answered %+v, %v", resp, err)
	}
	if _, err := svc.reset(context.Background(), nameRequest{Name: "buf"}); err != nil || b.Len() != 0 {
		t.Fatalf("reset: %v, Len %d", err, b.Len())
	}
}

// FuzzDeleteRequest decodes arbitrary bytes as a replay.delete request and
// hands it to a buffer: a clear error or a count, never a panic, and the
// buffer keeps serving whole rows.
func FuzzDeleteRequest(f *testing.F) {
	for _, g := range controlsGolden[:2] { // the delete requests
		var out []byte
		if err := codec.NewEncoderBytes(&out, msgpackHandle).Encode(g.msg); err != nil {
			f.Fatal(err)
		}
		f.Add(out)
	}
	f.Add([]byte{0x81, 0xa4, 'i', 'n', 'f', 'o', 0x81, 0xa7, 'i', 'n', 'd', 'i', 'c', 'e', 's', 0x91, 0xff})
	f.Add([]byte{0x80})
	b := create(f, Config{Capacity: 8, Sampler: LIFO()})
	svc := serveAt(f, b, "x")
	f.Fuzz(func(t *testing.T, data []byte) {
		var req deleteRequest
		if err := codec.NewDecoderBytes(data, msgpackHandle).Decode(&req); err != nil {
			return
		}
		req.Name = "buf"
		before := b.Len()
		n, err := svc.delete(context.Background(), req)
		if err == nil && (n.Deleted < 0 || n.Deleted > before || b.Len() != before-n.Deleted) {
			t.Fatalf("deleted %d of %d; Len now %d", n.Deleted, before, b.Len())
		}
		if b.Len() < 4 {
			extend(t, b, 1, 2, 3, 4)
		}
		td, _, err := b.Sample(ctxT(t), 2)
		if err != nil {
			t.Fatal(err)
		}
		rowIDs(t, td)
	})
}

// decodeMsgpack decodes data as rpc's handle does.
func decodeMsgpack(data []byte, v any) error {
	return codec.NewDecoderBytes(data, msgpackHandle).Decode(v)
}
