package replay

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"

	"github.com/tensorwire/tensorwire/rpc"
)

// The files under testdata/meta are replay.json files written by buffers
// of five configurations (lifo.json, added with replay.info's resample_all,
// was made from fifo.json; its round trip shows a buffer writes it so), and
// testdata/wire holds the msgpack of their info and stats responses, as hex. They pin the bytes: a buffer written by an
// older version must read back as the same configuration and be written
// out again byte for byte, and its messages must not change on the wire.
var goldenBuffers = []string{"topk_prioritized", "defaults_lazy", "fifo", "without_replacement", "lifo"}

// checkpointTime matches the one part of replay.json that changes at each
// write.
var checkpointTime = regexp.MustCompile(`"time": "[^"]*"`)

// goldenBuffer returns a Buffer, with no files, configured as the golden
// replay.json called name, and that file's bytes.
func goldenBuffer(t *testing.T, name string) (*Buffer, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "meta", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	m, cfg, err := parseMeta(data)
	if err != nil {
		t.Fatal(err)
	}
	b := newBuffer(filepath.Join(t.TempDir(), name), cfg, m.ID)
	if ck := m.Checkpoint; ck != nil {
		b.limit.inserts, b.limit.samples = ck.Inserted, ck.Sampled
		for s := range ck.Size {
			b.sel.Insert(s, uint64(s), 1)
		}
	}
	return b, data
}

// TestMeta_GoldenRoundTrip: replay.json as written before the sampler and
// writer kinds were typed reads back and is written again unchanged.
func TestMeta_GoldenRoundTrip(t *testing.T) {
	for _, name := range goldenBuffers {
		t.Run(name, func(t *testing.T) {
			b, want := goldenBuffer(t, name)
			got, err := b.metaLocked()
			if err != nil {
				t.Fatal(err)
			}
			got = checkpointTime.ReplaceAll(got, []byte(`"time": "T"`))
			want = checkpointTime.ReplaceAll(want, []byte(`"time": "T"`))
			if !bytes.Equal(got, want) {
				t.Errorf("replay.json written as\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// goldenHex reads testdata/wire/name.
func goldenHex(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "wire", name))
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// msgpackHandle encodes as rpc's handle does (rpc/wire.go).
var msgpackHandle = &codec.MsgpackHandle{WriteExt: true}

func encodeGolden(t *testing.T, v any) []byte {
	t.Helper()
	var out []byte
	if err := codec.NewEncoderBytes(&out, msgpackHandle).Encode(v); err != nil {
		t.Fatal(err)
	}
	return out
}

// serveAt returns a Service that serves b as "buf", its prefix moved to
// rel under the server's root.
func serveAt(t testing.TB, b *Buffer, rel string) *Service {
	t.Helper()
	root := t.TempDir()
	b.prefix = filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(b.prefix, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	svc, err := Register(srv)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Add("buf", b); err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestWire_GoldenInfoAndStats: the info response of a buffer (its sampler
// and writer among its fields) and its stats keep their bytes on the wire.
func TestWire_GoldenInfoAndStats(t *testing.T) {
	for _, name := range goldenBuffers {
		t.Run(name, func(t *testing.T) {
			b, _ := goldenBuffer(t, name)
			svc := serveAt(t, b, "x/y")
			info, err := svc.info(context.Background(), infoRequest{Name: "buf"})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := encodeGolden(t, info), goldenHex(t, name+".info.hex"); !bytes.Equal(got, want) {
				t.Errorf("info response encoded as\n%x\nwant\n%x", got, want)
			}
			var back infoResponse
			if err := codec.NewDecoderBytes(goldenHex(t, name+".info.hex"), msgpackHandle).Decode(&back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Writer, info.Writer) || back.Sampler != info.Sampler || back.ResampleAll != info.ResampleAll {
				t.Errorf("info response decoded with writer %v, sampler %v, resample_all %v; want %v, %v, %v",
					back.Writer, back.Sampler, back.ResampleAll, info.Writer, info.Sampler, info.ResampleAll)
			}
			if want := name == "lifo"; info.ResampleAll != want {
				t.Errorf("resample_all %v; want %v", info.ResampleAll, want)
			}

			want := goldenHex(t, name+".stats.hex")
			var st Stats
			if err := codec.NewDecoderBytes(want, msgpackHandle).Decode(&st); err != nil {
				t.Fatal(err)
			}
			if st.Sampler != b.cfg.Sampler.String() {
				t.Errorf("stats name the sampler %q; the buffer's is %q", st.Sampler, b.cfg.Sampler)
			}
			if got := encodeGolden(t, st); !bytes.Equal(got, want) {
				t.Errorf("stats encoded as\n%x\nwant\n%x", got, want)
			}
		})
	}
}
