package store

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestWritePrefix_ChunkedIsIntact: writePrefix writes a tensor in chunks of
// writebackChunk, starting each chunk's writeback as it goes. Tensors of
// sizes around and across chunk boundaries, in Go memory and mapped (read
// through ReadAt), with and without sync, come back byte for byte.
func TestWritePrefix_ChunkedIsIntact(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, writebackChunk - 1, writebackChunk, writebackChunk + 1, 2*writebackChunk + writebackChunk/2 + 3}
	src, err := tensordict.New()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for i, n := range sizes {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		x, err := tensordict.FromBytes(memmap.Uint8, []int{n}, b)
		if err != nil {
			t.Fatal(err)
		}
		key := string(rune('a' + i))
		if err := src.Set(key, x); err != nil {
			t.Fatal(err)
		}
		want[key] = b
	}
	// The same tensors mapped: writeLeaf reads those through ReadAt.
	mapped, err := src.Memmap(filepath.Join(dir, "mapped"))
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	for _, c := range []struct {
		name   string
		td     *tensordict.TensorDict
		noSync bool
	}{{"memory", src, false}, {"mapped", mapped, false}, {"memory-nosync", src, true}, {"mapped-nosync", mapped, true}} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+c.name)
			if err := writePrefix(c.td, out, c.noSync); err != nil {
				t.Fatal(err)
			}
			got, err := tensordict.LoadMemmap(out, tensordict.ReadOnly())
			if err != nil {
				t.Fatal(err)
			}
			defer got.Close()
			for key, b := range want {
				x, err := got.Tensor(key)
				if err != nil {
					t.Fatal(err)
				}
				g := make([]byte, x.NumBytes())
				if _, err := x.ReadAt(g, 0); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(g, b) {
					t.Errorf("tensor %s (%d bytes) differs after writePrefix", key, len(b))
				}
			}
		})
	}
}

// TestLogWriter_BatchOverIOVMax: a batch of more frames than one writev
// takes (IOV_MAX, 1024) is written whole and in order.
func TestLogWriter_BatchOverIOVMax(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), logName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte(logMagic)); err != nil {
		t.Fatal(err)
	}
	w := newLogWriter(f, int64(len(logMagic)), 0, true)
	const n = 2500
	var batch []queued
	for rev := uint64(1); rev <= n; rev++ {
		p, err := prepare(&record{Op: recDelete, Name: string(rune('a' + rev%26))})
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, queued{p.seal(rev), rev})
	}
	var frames [][]byte
	var buf []byte
	if err := w.write(batch, &frames, &buf); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	end, err := readLog(f, func(rec *record) error {
		got = append(got, rec.Rev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); end != fi.Size() || end != w.size {
		t.Errorf("the good records end at %d; the file is %d bytes, the writer counted %d", end, fi.Size(), w.size)
	}
	if len(got) != n {
		t.Fatalf("%d records read back, want %d", len(got), n)
	}
	for i, rev := range got {
		if rev != uint64(i+1) {
			t.Fatalf("record %d has revision %d", i, rev)
		}
	}
}

// TestPrepare_LargerThanItsEstimate: a record whose encoding outgrows the
// buffer prepare sizes for it (a base record restating many requests with
// large numbers) is framed whole all the same, and reads back as it was.
func TestPrepare_LargerThanItsEstimate(t *testing.T) {
	rec := &record{Op: recBase, Name: "0123456789abcdef", NextID: 1 << 60}
	for i := range 3000 {
		rec.Reqs = append(rec.Reqs, reqEntry{ID: reqID{Client: 1<<63 + uint64(i), Seq: 1<<40 + uint64(i)}, Rev: 1<<50 + uint64(i), Version: 1 << 45})
	}
	p, err := prepare(rec)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), logName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append([]byte(logMagic), p.seal(0)...)); err != nil {
		t.Fatal(err)
	}
	f.Seek(0, 0)
	var got []*record
	if _, err := readLog(f, func(r *record) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Reqs) != len(rec.Reqs) || got[0].Reqs[2999] != rec.Reqs[2999] || got[0].NextID != rec.NextID {
		t.Fatalf("read back %d records, not the one written", len(got))
	}
}
