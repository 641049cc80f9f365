package replay

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzOpen opens a buffer whose replay.json and slot table are arbitrary
// bytes: Open fails with an error or gives a buffer that samples and
// extends without crashing, and never returns a torn or foreign row.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	b, err := Create(filepath.Join(dir, "seed"), Config{Capacity: 4, Schema: testSchema, Sampler: Prioritized(0.6, 0.4)})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := b.Extend(ctxT(f), transitions(f, 1, 2, 3)); err != nil {
		f.Fatal(err)
	}
	b.Close()
	meta, err := os.ReadFile(filepath.Join(dir, "seed", MetaFile))
	if err != nil {
		f.Fatal(err)
	}
	slots, err := os.ReadFile(filepath.Join(dir, "seed", SlotsFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(meta, slots)
	f.Add(meta, slots[:40])
	f.Add([]byte(`{"format":"tensorwire.replay","version":1,"capacity":4,"sampler":{"kind":"fifo"},"writer":{"kind":"top_k","key":["reward"]}}`), slots)
	f.Add([]byte(`{"format":"tensorwire.replay","version":1,"capacity":1000000000000}`), slots)
	f.Fuzz(func(t *testing.T, meta, slots []byte) {
		prefix := filepath.Join(t.TempDir(), "buf")
		if err := os.CopyFS(prefix, os.DirFS(filepath.Join(dir, "seed"))); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(prefix, MetaFile), meta, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(prefix, SlotsFile), slots, 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := Open(prefix)
		if err != nil {
			return
		}
		defer b.Close()
		ctx := ctxT(t)
		if b.Schema() == nil {
			return
		}
		if err := testSchema.Match(b.Schema()); err != nil {
			return // a schema the seed storage does not have cannot have opened
		}
		if b.Len() > 0 {
			dst, err := testSchema.Zeros(2)
			if err != nil {
				t.Fatal(err)
			}
			short, cancel := contextWithTimeout(ctx)
			defer cancel()
			if _, err := b.SampleInto(short, dst); err == nil {
				// Rows of a corrupt table may hold anything, but whole
				// rows of the seed's writes or zeros.
				if _, err := checkRows(dst); err != nil {
					t.Fatalf("sampled a torn row from a reopened buffer: %v", err)
				}
			}
		}
		short, cancel := contextWithTimeout(ctx)
		defer cancel()
		if _, err := b.Extend(short, transitions(t, 7)); err != nil {
			return
		}
	})
}

// contextWithTimeout bounds a call that may wait for good on a fuzzed
// configuration (a rate limit, say).
func contextWithTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 50*time.Millisecond)
}
