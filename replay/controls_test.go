package replay

import (
	"context"
	"errors"
	"slices"
	"sort"
	"testing"
	"time"
)

// waitsShort reports whether a sample of n from b waits (until a short
// deadline) instead of returning.
func waitsShort(t *testing.T, sample func(context.Context, int) error, n int) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	return errors.Is(sample(ctx, n), context.DeadlineExceeded)
}

func TestSelectors_LIFOAndHeaps(t *testing.T) {
	for _, tc := range []struct {
		sampler Sampler
		prios   []float64
		want    []int
	}{
		{LIFO(), nil, []int{4, 3}},
		{MaxHeap(), []float64{1, 5, 2, 5, 0}, []int{3, 1}}, // ties: the newest
		{MinHeap(), []float64{1, 5, 2, 5, 0}, []int{4, 0}},
	} {
		t.Run(tc.sampler.String(), func(t *testing.T) {
			b := create(t, Config{Capacity: 8, Sampler: tc.sampler})
			if _, err := b.ExtendPriority(ctxT(t), transitions(t, 0, 1, 2, 3, 4), tc.prios); err != nil {
				t.Fatal(err)
			}
			for range 2 { // left in: the same twice
				td, _, err := b.Sample(ctxT(t), 2)
				if err != nil {
					t.Fatal(err)
				}
				if got := rowIDs(t, td); !slices.Equal(got, tc.want) {
					t.Fatalf("sample %v, want %v", got, tc.want)
				}
			}
			if b.Len() != 5 {
				t.Fatalf("Len %d after sampling, want 5", b.Len())
			}
			if tc.sampler.Kind() == "max_heap" {
				// UpdatePriority reorders.
				if _, err := b.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{0}}, []float64{9}); err != nil {
					t.Fatal(err)
				}
				td, _, _ := b.Sample(ctxT(t), 1)
				if got := rowIDs(t, td); got[0] != 0 {
					t.Fatalf("after raising 0's priority, sampled %v", got)
				}
			}
		})
	}
}

func TestMaxTimesSampled_ItemsLeave(t *testing.T) {
	for _, tc := range []struct {
		sampler Sampler
		k       int
	}{
		{Uniform(), 1}, {Uniform(), 3}, {Prioritized(0.6, 0.4), 2}, {LIFO(), 1}, {FIFO(), 2}, {WithoutReplacement(), 2},
	} {
		t.Run(tc.sampler.Kind(), func(t *testing.T) {
			prefix := t.TempDir() + "/buf"
			b, err := Create(prefix, Config{Capacity: 16, Sampler: tc.sampler, MaxTimesSampled: tc.k})
			if err != nil {
				t.Fatal(err)
			}
			extend(t, b, seq(0, 10)...)
			k := tc.k
			if tc.sampler.Kind() == "fifo" {
				k = 1 // a queue consumes what it returns
			}
			count := map[int]int{}
			td, _, err := b.Sample(ctxT(t), 10*k-3)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range rowIDs(t, td) {
				count[id]++
			}
			// 3 samples left in the buffer: a sample of 4 waits, until an
			// insert gives it more.
			sample := func(ctx context.Context, n int) error { _, _, err := b.Sample(ctx, n); return err }
			if !waitsShort(t, sample, 4) {
				t.Fatal("a sample of more than what is left did not wait")
			}
			// Reopened: the transitions sampled k times stay out.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if b, err = Open(prefix); err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			out := 0
			for id, c := range count {
				if c > k {
					t.Fatalf("transition %d sampled %d times; at most %d", id, c, k)
				}
				if c == k {
					out++
				}
			}
			if b.Len() != 10-out {
				t.Fatalf("reopened with %d sampleable; %d were sampled %d times of 10", b.Len(), out, k)
			}
			if b.Config().MaxTimesSampled != tc.k {
				t.Fatalf("reopened with MaxTimesSampled %d", b.Config().MaxTimesSampled)
			}
			// All that is left, exactly k times each from the reopening.
			td, _, err = b.Sample(ctxT(t), b.Len()*k)
			if err != nil {
				t.Fatal(err)
			}
			again := map[int]int{}
			for _, id := range rowIDs(t, td) {
				again[id]++
				if count[id] == k {
					t.Fatalf("transition %d sampled again after it left", id)
				}
			}
			for id, c := range again {
				if c != k {
					t.Fatalf("transition %d sampled %d times after reopening; want %d", id, c, k)
				}
			}
			if b.Len() != 0 {
				t.Fatalf("Len %d once everything was sampled %d times", b.Len(), k)
			}
		})
	}
}

func TestDeleteAndReset(t *testing.T) {
	for _, w := range []Writer{RoundRobin(), TopK("reward")} {
		t.Run(w.Kind(), func(t *testing.T) {
			prefix := t.TempDir() + "/buf"
			b, err := Create(prefix, Config{Capacity: 6, Writer: w, Sampler: FIFO(), Limit: RateLimit{SamplesPerInsert: 1, ErrorBuffer: 100}})
			if err != nil {
				t.Fatal(err)
			}
			idx := extend(t, b, 1, 2, 3, 4)
			td, info, err := b.Sample(ctxT(t), 1) // 1, consumed
			if err != nil || rowIDs(t, td)[0] != 1 {
				t.Fatalf("sample %v", err)
			}
			// Delete 2 by its generation, 3 with a stale one, 4 by index.
			w2, w3 := b.slots.word(idx[1]), b.slots.word(idx[2])
			n, err := b.Delete(ctxT(t), SampleInfo{Indices: []int{idx[1], idx[2]}, IDs: []uint64{gen(w2), gen(w3) + 1}})
			if err != nil || n != 1 {
				t.Fatalf("Delete by generation: %d, %v; want 1", n, err)
			}
			if n, err := b.Delete(ctxT(t), SampleInfo{Indices: []int{idx[3], idx[3]}}); err != nil || n != 1 {
				t.Fatalf("Delete by index: %d, %v; want 1", n, err)
			}
			if _, err := b.Delete(ctxT(t), SampleInfo{Indices: []int{6}}); !errors.Is(err, ErrSchema) {
				t.Fatalf("Delete of slot 6 of 6: %v", err)
			}
			if got := sampleIDsOf(t, b, 1); got[0] != 3 {
				t.Fatalf("after deleting 2 and 4, sampled %v; want 3", got)
			}
			_ = info
			// Deleted slots are free again: 6 more fit (top-k drops none).
			idx = extend(t, b, 11, 12, 13, 14, 15, 16)
			if slices.Contains(idx, -1) {
				t.Fatalf("after deletes, the writer dropped: %v", idx)
			}
			st := stats(t, b)
			if st.Size != 6 || st.Inserted != 10 || st.Sampled != 2 {
				t.Fatalf("before reset: %+v", st)
			}
			if err := b.Reset(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if st := stats(t, b); st.Size != 0 || st.Inserted != 0 || st.Sampled != 0 {
				t.Fatalf("after reset: %+v", st)
			}
			sample := func(ctx context.Context, n int) error { _, _, err := b.Sample(ctx, n); return err }
			if !waitsShort(t, sample, 1) {
				t.Fatal("a reset buffer gave a sample")
			}
			// Reopened, a reset buffer is empty; it fills again.
			b.Close()
			if b, err = Open(prefix); err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if st := stats(t, b); st.Size != 0 || st.Inserted != 0 {
				t.Fatalf("reopened after reset: %+v", st)
			}
			extend(t, b, 21, 22, 23, 24, 25, 26)
			got := sampleIDsOf(t, b, 6)
			sort.Ints(got)
			if !slices.Equal(got, []int{21, 22, 23, 24, 25, 26}) {
				t.Fatalf("after reset and refill: %v", got)
			}
		})
	}
}

func sampleIDsOf(t *testing.T, b *Buffer, n int) []int {
	t.Helper()
	td, _, err := b.Sample(ctxT(t), n)
	if err != nil {
		t.Fatal(err)
	}
	return rowIDs(t, td)
}

// TestRemote_DeleteReset: a client deletes and resets over the wire, in
// both modes; a sample by reference never returns a deleted row.
func TestRemote_DeleteReset(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 8, Sampler: LIFO(), MaxTimesSampled: 2})
			c := dialBuffer(t, n.addr, "buf", root, mode)
			extend(t, c, 1, 2, 3)
			td, info, err := c.Sample(ctxT(t), 2)
			if err != nil {
				t.Fatal(err)
			}
			if got := rowIDs(t, td); !slices.Equal(got, []int{3, 3}) { // one at a time: 3 until it leaves
				t.Fatalf("LIFO, max 2 times: %v", got)
			}
			del, err := c.Delete(ctxT(t), SampleInfo{Indices: []int{info.Indices[0], 1}})
			if err != nil || del != 1 { // 3 had left already
				t.Fatalf("Delete: %d, %v", del, err)
			}
			td, _, err = c.Sample(ctxT(t), 2)
			if err != nil {
				t.Fatal(err)
			}
			if got := rowIDs(t, td); !slices.Equal(got, []int{1, 1}) {
				t.Fatalf("after deleting 2: %v", got)
			}
			extend(t, c, 4)
			if err := c.Reset(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			st, err := c.Stats(ctxT(t))
			if err != nil || st.Size != 0 {
				t.Fatalf("after reset: %+v, %v", st, err)
			}
			sample := func(ctx context.Context, n int) error { _, _, err := c.Sample(ctx, n); return err }
			if !waitsShort(t, sample, 1) {
				t.Fatal("a reset buffer gave a sample")
			}
		})
	}
}
