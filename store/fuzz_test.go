package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

// FuzzDecodeValue: no bytes make decodeValue panic, and what it accepts
// encodes back to a value that decodes to the same TensorDict.
func FuzzDecodeValue(f *testing.F) {
	nested, _ := tensordict.New(2)
	x, _ := tensordict.FromSlice([]float32{1, 2, 3, 4}, 2, 2)
	nested.Set("x", x)
	sub, _ := tensordict.New(2, 1)
	y, _ := tensordict.FromSlice([]int8{5, 6}, 2, 1)
	sub.Set("y", y)
	nested.Set("sub", sub)
	nested.Set("note", &tensordict.NonTensor{Data: map[string]any{"v": 3.0}})
	empty, _ := tensordict.New()
	for _, td := range []*tensordict.TensorDict{itemTD(f, 7, 3), nested, empty} {
		b, err := encodeValue(td)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("TWV1\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		td, err := decodeValue(b)
		if err != nil {
			return
		}
		again, err := encodeValue(td)
		if err != nil {
			t.Fatalf("a decoded value does not encode: %v", err)
		}
		td2, err := decodeValue(again)
		if err != nil {
			t.Fatalf("a re-encoded value does not decode: %v", err)
		}
		if !td.Equal(td2) {
			t.Fatal("decode(encode(decode(b))) differs from decode(b)")
		}
	})
}

// FuzzReadLog: no log file makes readLog panic or report good records
// past the file's end.
func FuzzReadLog(f *testing.F) {
	dir := f.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		f.Fatal(err)
	}
	ctx := ctxT(f)
	s.Append(ctx, "b", itemTD(f, 1, 4))
	s.Publish(ctx, "p", itemTD(f, 2, 4))
	tk, _ := s.takeItems("b", true, 0)
	s.ackTake(tk.id)
	s.Close()
	good, err := os.ReadFile(filepath.Join(dir, logName))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-3])
	f.Add([]byte(logMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), logName)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		st := &Store{bins: map[string]*bin{}, params: map[string]*paramSet{}, takes: map[uint64]*take{},
			leases: map[uint64]*lease{}, hist: history{max: 100}, reqs: requests{clients: map[uint64]*clientReqs{}}}
		end, err := readLog(fh, func(rec *record) error {
			if err := checkRecord(rec); err != nil {
				return err
			}
			st.apply(rec)
			return nil
		})
		if err == nil && end > int64(len(b)) {
			t.Fatalf("good records up to %d in a file of %d bytes", end, len(b))
		}
	})
}
