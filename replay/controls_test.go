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

// TestSelectors_ResampleKeepsRowsDistinct: a LIFO, MaxHeap or MinHeap
// sample of n is the n first in its order, all different, also when a row
// it picked is deleted (or overwritten) while it copies it. Before the fix
// the row was replaced by a pick of 1, the first in the order again,
// which the sample already held: one transition twice. The steps are
// SampleInto's (pick, then gather), with a trainer's Delete in between.
func TestSelectors_ResampleKeepsRowsDistinct(t *testing.T) {
	for _, tc := range []struct {
		sampler Sampler
		prios   []float64 // the order 3, 2, 1
	}{
		{LIFO(), nil}, {MaxHeap(), []float64{1, 2, 3}}, {MinHeap(), []float64{3, 2, 1}},
	} {
		t.Run(tc.sampler.String(), func(t *testing.T) {
			b := create(t, Config{Capacity: 4, Sampler: tc.sampler})
			ctx := ctxT(t)
			if _, err := b.ExtendPriority(ctx, transitions(t, 1, 2, 3), tc.prios); err != nil {
				t.Fatal(err)
			}
			dst, err := testSchema.Zeros(2)
			if err != nil {
				t.Fatal(err)
			}
			var info SampleInfo
			if err := b.pick(ctx, 2, &info); err != nil { // 3 and 2
				t.Fatal(err)
			}
			// Another trainer deletes the second row while this sample copies it.
			if n, err := b.Delete(ctx, SampleInfo{Indices: info.Indices[1:], IDs: info.IDs[1:]}); err != nil || n != 1 {
				t.Fatalf("Delete: %d, %v", n, err)
			}
			if err := b.gather(ctx, b.storage, dst, &info); err != nil {
				t.Fatal(err)
			}
			if ids := rowIDs(t, dst); !slices.Equal(ids, []int{3, 1}) {
				t.Fatalf("the sample of 2 holds %v (slots %v); want the first 2 left in the order, [3 1]", ids, info.Indices)
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

// TestMaxTimesSampled_SampleWaitsForPickableRows: with MaxTimesSampled 1
// and a prioritized sampler of eps 0, transition 1 (priority 1) can be
// picked and 2 (priority 0) cannot. A sample of 2 must wait, taking
// nothing; then a sample of 1 returns transition 1. Before the fix the
// sample of 2 picked 1 (its last sample: out for good), failed on its
// second pick with ErrContended ("rows kept being overwritten", which none
// were) and returned nothing: transition 1 was lost, never delivered.
func TestMaxTimesSampled_SampleWaitsForPickableRows(t *testing.T) {
	sampler, err := ParseSampler("prioritized(alpha=1, beta=0, eps=0)")
	if err != nil {
		t.Fatal(err)
	}
	b := create(t, Config{Capacity: 4, Sampler: sampler, MaxTimesSampled: 1})
	ctx := ctxT(t)
	idx, err := b.ExtendPriority(ctx, transitions(t, 1, 2), []float64{1, 0})
	if err != nil {
		t.Fatal(err)
	}
	sample := func(ctx context.Context, n int) error { _, _, err := b.Sample(ctx, n); return err }
	if !waitsShort(t, sample, 2) {
		t.Fatal("a sample of 2 from a buffer that can give 1 did not wait")
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	td, _, err := b.Sample(short, 1)
	if err != nil {
		t.Fatalf("after the sample of 2 waited, transition 1, never returned, cannot be sampled: %v", err)
	}
	if ids := rowIDs(t, td); ids[0] != 1 {
		t.Fatalf("sampled %v", ids)
	}
	// Transition 2 given a priority can be picked, and joins the count.
	if n, err := b.UpdatePriority(ctx, SampleInfo{Indices: idx[1:]}, []float64{1}); err != nil || n != 1 {
		t.Fatalf("UpdatePriority: %d, %v", n, err)
	}
	if td, _, err = b.Sample(short, 1); err != nil || rowIDs(t, td)[0] != 2 {
		t.Fatalf("transition 2 of priority 1: %v", err)
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
