package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// transitions returns a batch of n transitions whose every element encodes
// its transition's id, so a test can tell which transition a row holds and
// whether it is whole: obs uint8 [4, 4], action int64, reward float32.
func transitions(t testing.TB, ids ...int) *tensordict.TensorDict {
	t.Helper()
	return transitionsSized(t, 4, ids...)
}

// transitionsSized is transitions with obs of shape [side, side].
func transitionsSized(t testing.TB, side int, ids ...int) *tensordict.TensorDict {
	t.Helper()
	n, size := len(ids), side*side
	obs := make([]uint8, n*size)
	act := make([]int64, n)
	rew := make([]float32, n)
	for i, id := range ids {
		for j := range size {
			obs[i*size+j] = uint8(id)
		}
		act[i], rew[i] = int64(id), float32(id)
	}
	td, err := tensordict.New(n)
	if err != nil {
		t.Fatal(err)
	}
	for key, v := range map[string]func() (*tensordict.Tensor, error){
		"obs":    func() (*tensordict.Tensor, error) { return tensordict.FromSlice(obs, n, side, side) },
		"action": func() (*tensordict.Tensor, error) { return tensordict.FromSlice(act, n) },
		"reward": func() (*tensordict.Tensor, error) { return tensordict.FromSlice(rew, n) },
	} {
		x, err := v()
		if err != nil {
			t.Fatal(err)
		}
		if err := td.Set(key, x); err != nil {
			t.Fatal(err)
		}
	}
	return td
}

var testSchema = tensordict.RowSchema{
	{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{4, 4}},
	{Key: []string{"action"}, DType: memmap.Int64},
	{Key: []string{"reward"}, DType: memmap.Float32},
}

// rowIDs returns the transition id each row of td holds, failing the test
// if a row's fields disagree (a torn row).
func rowIDs(t testing.TB, td *tensordict.TensorDict) []int {
	t.Helper()
	ids, err := checkRows(td)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// checkRows is rowIDs returning an error for a torn row.
func checkRows(td *tensordict.TensorDict) ([]int, error) {
	obs, err := td.Tensor("obs")
	if err != nil {
		return nil, err
	}
	act, err := td.Tensor("action")
	if err != nil {
		return nil, err
	}
	rew, err := td.Tensor("reward")
	if err != nil {
		return nil, err
	}
	o, _ := tensordict.Values[uint8](obs)
	a, _ := tensordict.Values[int64](act)
	r, _ := tensordict.Values[float32](rew)
	ids := make([]int, len(a))
	size := len(o) / len(a)
	for i := range a {
		ids[i] = int(a[i])
		if float32(a[i]) != r[i] {
			return nil, fmt.Errorf("row %d: action %d, reward %v", i, a[i], r[i])
		}
		for j, v := range o[i*size : (i+1)*size] {
			if v != uint8(a[i]) {
				return nil, fmt.Errorf("row %d: action %d, obs[%d] = %d", i, a[i], j, v)
			}
		}
	}
	return ids, nil
}

// stats returns b's Stats, failing the test on an error.
func stats(t testing.TB, b *Buffer) Stats {
	t.Helper()
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func create(t testing.TB, cfg Config) *Buffer {
	t.Helper()
	b, err := Create(filepath.Join(t.TempDir(), "buf"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func extend(t testing.TB, b interface {
	Extend(context.Context, *tensordict.TensorDict) ([]int, error)
}, ids ...int) []int {
	t.Helper()
	idx, err := b.Extend(ctxT(t), transitions(t, ids...))
	if err != nil {
		t.Fatalf("Extend %v: %v", ids, err)
	}
	return idx
}

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestExtendSample_RoundRobinOverwritesOldest(t *testing.T) {
	b := create(t, Config{Capacity: 10})
	if got := extend(t, b, seq(0, 6)...); !slices.Equal(got, seq(0, 6)) {
		t.Fatalf("first batch went to %v", got)
	}
	if got := extend(t, b, seq(6, 12)...); !slices.Equal(got, []int{6, 7, 8, 9, 0, 1}) {
		t.Fatalf("second batch went to %v, want the ring order", got)
	}
	if b.Len() != 10 {
		t.Fatalf("Len = %d, want 10", b.Len())
	}
	td, info, err := b.Sample(ctxT(t), 2000)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for i, id := range rowIDs(t, td) {
		seen[id] = true
		if want := id % 10; info.Indices[i] != want {
			t.Fatalf("row %d holds transition %d but its index is %d", i, id, info.Indices[i])
		}
		if info.Weights[i] != 1 {
			t.Fatalf("uniform weight %v", info.Weights[i])
		}
	}
	for id := range 12 {
		if want := id >= 2; seen[id] != want {
			t.Errorf("transition %d sampled: %v, want %v (0 and 1 were overwritten)", id, seen[id], want)
		}
	}
}

func TestExtend_SchemaFromFirstBatchOrGiven(t *testing.T) {
	for _, tc := range []struct {
		name   string
		schema tensordict.RowSchema
	}{{"lazy", nil}, {"given", testSchema}} {
		t.Run(tc.name, func(t *testing.T) {
			b := create(t, Config{Capacity: 4, Schema: tc.schema})
			if tc.schema == nil && b.Schema() != nil {
				t.Fatalf("schema before the first batch: %v", b.Schema())
			}
			extend(t, b, 7)
			if err := testSchema.Match(b.Schema()); err != nil {
				t.Fatal(err)
			}
			st, err := tensordict.LoadMemmap(filepath.Join(b.Prefix(), StorageDir), tensordict.ReadOnly())
			if err != nil {
				t.Fatalf("the storage is not a tensordict memmap: %v", err)
			}
			defer st.Close()
			if got := st.BatchSize(); !slices.Equal(got, []int{4}) {
				t.Fatalf("storage batch %v", got)
			}
		})
	}
}

func TestExtend_WrongSchemaChangesNothing(t *testing.T) {
	b := create(t, Config{Capacity: 4, Schema: testSchema})
	extend(t, b, 1, 2)
	before := storageBytes(t, b)
	bad := func(mutate func(td *tensordict.TensorDict)) *tensordict.TensorDict {
		td := transitions(t, 5, 6)
		mutate(td)
		return td
	}
	set := func(td *tensordict.TensorDict, key string, x *tensordict.Tensor, err error) {
		if err != nil {
			t.Fatal(err)
		}
		if err := td.Set(key, x); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		td   *tensordict.TensorDict
	}{
		{"wrong dtype", bad(func(td *tensordict.TensorDict) {
			x, err := tensordict.FromSlice([]int32{5, 6}, 2)
			set(td, "action", x, err)
		})},
		{"wrong shape", bad(func(td *tensordict.TensorDict) {
			x, err := tensordict.Zeros(memmap.Uint8, 2, 4, 5)
			set(td, "obs", x, err)
		})},
		{"extra key", bad(func(td *tensordict.TensorDict) {
			x, err := tensordict.Zeros(memmap.Bool, 2)
			set(td, "done", x, err)
		})},
		{"missing key", bad(func(td *tensordict.TensorDict) { td.Delete("reward") })},
		{"2-d batch", func() *tensordict.TensorDict {
			td, _ := tensordict.New(1, 2)
			return td
		}()},
		{"too large", transitions(t, seq(0, 5)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Extend(ctxT(t), tc.td)
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("err = %v, want ErrSchema", err)
			}
			if !bytes.Equal(before, storageBytes(t, b)) {
				t.Fatal("the storage changed")
			}
			if b.Len() != 2 {
				t.Fatalf("Len = %d", b.Len())
			}
		})
	}
}

// storageBytes returns a copy of every byte of b's storage.
func storageBytes(t testing.TB, b *Buffer) []byte {
	t.Helper()
	var all []byte
	for _, leaf := range b.storage.Leaves() {
		raw, err := leaf.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, raw...)
	}
	return all
}

func TestSample_EmptyWaitsUntilDeadline(t *testing.T) {
	b := create(t, Config{Capacity: 4, Schema: testSchema})
	start := time.Now() // before the deadline is set (TestRemote_EmptySampleDeadlineExceeded)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err := b.Sample(ctx, 1)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Fatal("returned before the deadline")
	}
	// A sample waiting when a batch arrives gets it.
	got := make(chan error, 1)
	go func() {
		td, _, err := b.Sample(ctxT(t), 3)
		if err == nil {
			for _, id := range rowIDs(t, td) {
				if id != 9 {
					err = fmt.Errorf("sampled %d", id)
				}
			}
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	extend(t, b, 9)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func TestRateLimit(t *testing.T) {
	t.Run("min size", func(t *testing.T) {
		b := create(t, Config{Capacity: 10, Limit: RateLimit{MinSize: 3}})
		extend(t, b, 1, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		if _, _, err := b.Sample(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("sampling below MinSize: %v", err)
		}
		extend(t, b, 3)
		if _, _, err := b.Sample(ctxT(t), 1); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("samples per insert", func(t *testing.T) {
		// 2 samples per insert, 4 samples of slack, from MinSize 2.
		b := create(t, Config{Capacity: 100, Limit: RateLimit{MinSize: 2, SamplesPerInsert: 2, ErrorBuffer: 4}})
		extend(t, b, 1, 2) // diff = 4, the offset: inside [0, 8]
		short := func() context.Context {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			t.Cleanup(cancel)
			return ctx
		}
		extend(t, b, 3, 4) // diff 8: still allowed
		if _, err := b.Extend(short(), transitions(t, 5)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("an insert past the ratio went in: %v", err)
		}
		if _, _, err := b.Sample(ctxT(t), 8); err != nil { // diff 0
			t.Fatal(err)
		}
		if _, _, err := b.Sample(short(), 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a sample past the ratio went through: %v", err)
		}
		extend(t, b, 5) // diff 2
		if _, _, err := b.Sample(ctxT(t), 2); err != nil {
			t.Fatal(err)
		}
		st := stats(t, b)
		if st.Inserted != 5 || st.Sampled != 10 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestTopK_KeepsLargest(t *testing.T) {
	b := create(t, Config{Capacity: 3, Writer: TopK("reward")})
	first := extend(t, b, 5, 1, 9)
	// Largest first: 7 replaces the smallest, 1; then 3 and 0 are smaller
	// than everything left (5, 9) and are dropped.
	if idx := extend(t, b, 3, 0, 7); !slices.Equal(idx, []int{-1, -1, first[1]}) {
		t.Fatalf("the batch [3 0 7] went to %v, want [-1 -1 %d] (7 into the slot of 1)", idx, first[1])
	}
	td, _, err := b.Sample(ctxT(t), 200)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]bool{}
	for _, id := range rowIDs(t, td) {
		got[id] = true
	}
	if !maps.Equal(got, map[int]bool{5: true, 9: true, 7: true}) {
		t.Fatalf("buffer holds %v, want the top 3 {5, 7, 9}", got)
	}
}

func TestFIFO_IsAQueue(t *testing.T) {
	b := create(t, Config{Capacity: 10, Sampler: FIFO()})
	extend(t, b, 1, 2, 3)
	extend(t, b, 4, 5)
	td, _, err := b.Sample(ctxT(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := rowIDs(t, td); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("first sample %v", got)
	}
	td, _, err = b.Sample(ctxT(t), 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := rowIDs(t, td); !slices.Equal(got, []int{3, 4, 5}) {
		t.Fatalf("second sample %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := b.Sample(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an empty queue: %v", err)
	}
}

func TestPrioritized_UpdatePriority(t *testing.T) {
	b := create(t, Config{Capacity: 4, Sampler: Prioritized(1, 1)})
	extend(t, b, 0, 1, 2, 3)
	// Slot 2 gets all the priority.
	if _, err := b.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{0, 1, 2, 3}}, []float64{0, 0, 100, 0}); err != nil {
		t.Fatal(err)
	}
	td, info, err := b.Sample(ctxT(t), 100)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range rowIDs(t, td) {
		if id != 2 {
			t.Fatalf("row %d is transition %d; only 2 has priority", i, id)
		}
	}
	// A stale update (the slot was overwritten since) is skipped.
	before := gen(b.slots.word(0)) // what a sample of slot 0 would have recorded
	extend(t, b, 4)                // round robin: slot 0
	n, err := b.UpdatePriority(ctxT(t), info, slices.Repeat([]float64{1}, 100))
	if err != nil || n != 100 {
		t.Fatalf("updated %d, %v; want 100 (slot 2 still holds what was sampled)", n, err)
	}
	stale := SampleInfo{Indices: []int{0}, IDs: []uint64{before}}
	if n, err := b.UpdatePriority(ctxT(t), stale, []float64{5}); err != nil || n != 0 {
		t.Fatalf("the id of slot 0 before it was overwritten updated %d rows (%v)", n, err)
	}
	for _, bad := range [][]float64{{-1}, {math.NaN()}, {math.Inf(1)}} {
		if _, err := b.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{1}}, bad); !errors.Is(err, ErrSchema) {
			t.Errorf("priority %v: %v", bad, err)
		}
	}
	if _, err := b.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{4}}, []float64{1}); !errors.Is(err, ErrSchema) {
		t.Errorf("index out of range: %v", err)
	}
}

// TestUpdatePriority_WakesAWaitingSample: with eps 0, a buffer whose
// transitions all have priority 0 cannot be sampled, and Sample waits. An
// UpdatePriority giving one a positive priority makes it sampleable and
// wakes the sample. Before the fix it did not, and the sample slept on
// until something else changed the buffer or its context ended.
func TestUpdatePriority_WakesAWaitingSample(t *testing.T) {
	sampler, err := ParseSampler("prioritized(alpha=0.6, beta=0.4, eps=0)")
	if err != nil {
		t.Fatal(err)
	}
	b := create(t, Config{Capacity: 4, Sampler: sampler})
	ctx := ctxT(t)
	idx, err := b.ExtendPriority(ctx, transitions(t, 1), []float64{0})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, _, err := b.Sample(sctx, 1)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the sample is waiting
	if n, err := b.UpdatePriority(ctx, SampleInfo{Indices: idx}, []float64{1}); err != nil || n != 1 {
		t.Fatalf("UpdatePriority: %d, %v", n, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the transition has had priority 1 since 200 ms, but the waiting Sample: %v", err)
	}
}

// TestCommit_RetriedIsRecognised: a commit sent again (its reply was lost)
// succeeds without adding anything, and a commit of a reservation the
// buffer does not hold fails with ErrExpired.
func TestCommit_RetriedIsRecognised(t *testing.T) {
	b := create(t, Config{Capacity: 4})
	extend(t, b, 1)
	r, storage, err := b.reserve(ctxT(t), testSchema, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeRows(storage, r.slots, transitions(t, 2, 3)); err != nil {
		t.Fatal(err)
	}
	first, err := b.commit(r.rid, r.slots, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.commit(r.rid, r.slots, nil)
	if err != nil || !slices.Equal(first, again) {
		t.Fatalf("the retried commit: %v, %v; want %v", again, err, first)
	}
	if st := stats(t, b); st.Size != 3 || st.Inserted != 3 {
		t.Fatalf("after a retried commit: %+v; want 3 transitions, inserted once", st)
	}
	if _, err := b.commit(r.rid+1, []int{3}, nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("a commit of an unknown reservation: %v", err)
	}
	if _, err := b.commit(r.rid, []int{0}, nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("a commit naming slots the reservation did not take: %v", err)
	}
}

// TestCommit_RetriedAfterItsRowsLeft: a commit succeeds, its reply is
// lost, and before the writer's retry comes a later batch overwrites one of
// its rows, or a trainer deletes one. The retry must succeed, or the
// writer extends the batch again and its rows still in place are in the
// buffer twice. Before the fix the retry was refused with ErrExpired: a
// retry was recognised only while every slot still held the batch. It
// also succeeds once every row has left, and, after a restart, while one
// row is still in place.
func TestCommit_RetriedAfterItsRowsLeft(t *testing.T) {
	ctx := ctxT(t)
	committed := func(b *Buffer, ids ...int) *reservation {
		t.Helper()
		r, storage, err := b.reserve(ctx, testSchema, len(ids), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeRows(storage, r.slots, transitions(t, ids...)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.commit(r.rid, r.slots, nil); err != nil { // its reply is lost
			t.Fatal(err)
		}
		return r
	}
	retry := func(b *Buffer, r *reservation, what string) {
		t.Helper()
		if idx, err := b.commit(r.rid, r.slots, nil); err != nil || !slices.Equal(idx, r.slots) {
			t.Fatalf("the retried commit of a batch that was committed, %s: %v, %v; the writer would extend it again", what, idx, err)
		}
	}

	prefix := filepath.Join(t.TempDir(), "buf")
	b, err := Create(prefix, Config{Capacity: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { b.Close() }()
	r := committed(b, 1, 2) // slots 0 and 1
	extend(t, b, 3, 4)      // slots 2 and 0
	retry(b, r, "its first row overwritten")

	r = committed(b, 5) // slot 1
	if n, err := b.Delete(ctx, SampleInfo{Indices: r.slots}); err != nil || n != 1 {
		t.Fatalf("Delete: %d, %v", n, err)
	}
	retry(b, r, "its row deleted")

	r = committed(b, 6, 7)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err = Open(prefix); err != nil { // the node restarts before the retry
		t.Fatal(err)
	}
	if n, err := b.Delete(ctx, SampleInfo{Indices: r.slots[:1]}); err != nil || n != 1 {
		t.Fatalf("Delete: %d, %v", n, err)
	}
	retry(b, r, "after a restart, one row left")
	if _, err := b.commit(r.rid+1, r.slots[1:], nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("a commit of an id never handed out, naming a slot of another reservation: %v, want ErrExpired", err)
	}
}

// TestCommit_NamesItsReservationsSlots: a commit naming other slots than
// its reservation's is refused with ErrSchema, and the reservation is left
// to its writer, as a commit by bytes is (writeReserved). Before the fix
// commit ignored the slots it was sent, so a stale commit carrying a
// reused id committed another writer's slots before it had written them.
func TestCommit_NamesItsReservationsSlots(t *testing.T) {
	b := create(t, Config{Capacity: 4})
	r, storage, err := b.reserve(ctxT(t), testSchema, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range [][]int{{-1}, {-1, -1}, {r.slots[1], r.slots[0]}, {r.slots[0]}} {
		if _, err := b.commit(r.rid, other, nil); !errors.Is(err, ErrSchema) {
			t.Fatalf("a commit of reservation %v naming slots %v: %v, want ErrSchema", r.slots, other, err)
		}
	}
	if st := stats(t, b); st.Pending != 2 || st.Size != 0 {
		t.Fatalf("after the refused commits: %+v; want the reservation pending", st)
	}
	if err := writeRows(storage, r.slots, transitions(t, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.commit(r.rid, r.slots, nil); err != nil {
		t.Fatal(err)
	}
}

func TestReservation_Expires(t *testing.T) {
	b := create(t, Config{Capacity: 4, Lease: 50 * time.Millisecond})
	extend(t, b, 1)
	r, _, err := b.reserve(ctxT(t), testSchema, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := stats(t, b); st.Pending != 2 {
		t.Fatalf("pending %d", st.Pending)
	}
	// The lease's timer fires (polled: a busy machine may run it late).
	for deadline := time.Now().Add(30 * time.Second); stats(t, b).Expired == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reservation has not expired 30 s after its 50 ms lease: stats %+v", stats(t, b))
		}
	}
	if _, err := b.commit(r.rid, r.slots, nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("commit after the lease: %v", err)
	}
	st := stats(t, b)
	if st.Pending != 0 || st.Expired != 1 || st.Size != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The expired slots are written again next and never sampled empty.
	td, _, err := b.Sample(ctxT(t), 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range rowIDs(t, td) {
		if id != 1 {
			t.Fatalf("sampled %d", id)
		}
	}
}

func TestOpen_ResumesCommittedTransitions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "buf")
	b, err := Create(dir, Config{Capacity: 8, Sampler: Prioritized(1, 0.5)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := b.ExtendPriority(ctx, transitions(t, 0, 1, 2, 3, 4), []float64{1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	// An uncommitted reservation, as a writer that died would leave.
	if _, _, err := b.reserve(ctx, testSchema, 2, nil); err != nil {
		t.Fatal(err)
	}
	// No Close, no Checkpoint: only what the mappings hold. Unmap without
	// writing anything, as if the process died.
	b.closed.Store(true)
	b.closeFiles()

	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Len() != 5 {
		t.Fatalf("Len = %d after reopening, want 5", r.Len())
	}
	for s := range 5 {
		if p := r.slots.priority(s); p != float64(s+1) {
			t.Errorf("slot %d priority %v, want %v", s, p, s+1)
		}
	}
	for s := 5; s < 7; s++ {
		if st := state(r.slots.word(s)); st != stateEmpty {
			t.Errorf("slot %d state %d after reopening, want empty", s, st)
		}
	}
	// The writer resumes after the newest committed batch... or the
	// reservation: slots 5 and 6 were taken, so 7 is next, then 0.
	if got := extend(t, r, 10, 11); !slices.Equal(got, []int{7, 0}) {
		t.Fatalf("after reopening the writer wrote %v, want [7 0]", got)
	}
	td, _, err := r.Sample(ctx, 500)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, id := range rowIDs(t, td) {
		seen[id] = true
	}
	if !maps.Equal(seen, map[int]bool{1: true, 2: true, 3: true, 4: true, 10: true, 11: true}) {
		t.Fatalf("sampled %v", seen)
	}
	if _, err := Create(dir, Config{Capacity: 8}); !errors.Is(err, ErrExists) {
		t.Fatalf("Create over a buffer: %v", err)
	}
	if _, err := Open(t.TempDir()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open of an empty folder: %v", err)
	}
}

func TestClose_UnblocksWaiters(t *testing.T) {
	b, err := Create(filepath.Join(t.TempDir(), "b"), Config{Capacity: 4, Schema: testSchema})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, _, err := b.Sample(ctxT(t), 1)
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Fatalf("a waiting sample got %v, want ErrClosed", err)
	}
	if _, err := b.Extend(ctxT(t), transitions(t, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Extend after Close: %v", err)
	}
}
