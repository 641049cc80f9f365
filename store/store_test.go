package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// ctxT returns a context that ends with the test, bounded generously.
func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// openT opens a store in dir and closes it at the end of the test.
func openT(t testing.TB, dir string, o Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// item returns a TensorDict with an int64 tensor "x" of n elements, all
// id, and a NonTensor "id".
func itemTD(t testing.TB, id int64, n int) *tensordict.TensorDict {
	t.Helper()
	td, err := tensordict.New()
	if err != nil {
		t.Fatal(err)
	}
	xs := make([]int64, n)
	for i := range xs {
		xs[i] = id
	}
	x, err := tensordict.FromSlice(xs)
	if err != nil {
		t.Fatal(err)
	}
	if err := td.Set("x", x); err != nil {
		t.Fatal(err)
	}
	if err := td.Set("id", &tensordict.NonTensor{Data: id}); err != nil {
		t.Fatal(err)
	}
	return td
}

// idOf checks an item made by itemTD and returns its id.
func idOf(t testing.TB, td *tensordict.TensorDict) int64 {
	t.Helper()
	nt, err := td.NonTensor("id")
	if err != nil {
		t.Fatal(err)
	}
	u, ok := asUint(nt.Data)
	if !ok {
		t.Fatalf("id %#v", nt.Data)
	}
	id := int64(u)
	x, err := td.Tensor("x")
	if err != nil {
		t.Fatal(err)
	}
	xs, err := tensordict.Values[int64](x)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range xs {
		if v != id {
			t.Fatalf("item %d: x[%d] = %d", id, i, v)
		}
	}
	return id
}

func ids(t testing.TB, tds []*tensordict.TensorDict) []int64 {
	t.Helper()
	var out []int64
	for _, td := range tds {
		out = append(out, idOf(t, td))
		td.Close()
	}
	return out
}

func TestStore_Semantics(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{})
	mustRev := func(rev uint64, err error) uint64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	r1 := mustRev(s.Put(ctx, "b", itemTD(t, 1, 4)))
	r2 := mustRev(s.Put(ctx, "b", itemTD(t, 2, 4))) // replaces
	r3 := mustRev(s.Append(ctx, "b", itemTD(t, 3, 4)))
	r4 := mustRev(s.Append(ctx, "empty-before", itemTD(t, 4, 4)))
	if !slices.Equal([]uint64{r1, r2, r3, r4}, []uint64{1, 2, 3, 4}) {
		t.Fatalf("revisions %d %d %d %d, want 1 2 3 4", r1, r2, r3, r4)
	}
	counts, rev, err := s.List(ctx)
	if err != nil || rev != 4 || counts["b"] != 2 || counts["empty-before"] != 1 || len(counts) != 2 {
		t.Fatalf("List = %v at %d, %v; want b:2 empty-before:1 at 4", counts, rev, err)
	}
	peeked, err := s.Peek(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(t, peeked); !slices.Equal(got, []int64{2, 3}) {
		t.Fatalf("Peek = %v, want [2 3]", got)
	}
	got, err := s.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(t, got); !slices.Equal(got, []int64{2, 3}) {
		t.Fatalf("Get = %v, want [2 3]", got)
	}
	if got, err := s.Get(ctx, "b"); err != nil || len(got) != 0 {
		t.Fatalf("second Get = %d items, %v; want none", len(got), err)
	}
	counts, _, _ = s.List(ctx)
	if _, ok := counts["b"]; ok {
		t.Fatalf("List after Get = %v: an emptied bin is gone", counts)
	}
	if rev := mustRev(s.Delete(ctx, "empty-before")); rev != 6 {
		t.Fatalf("Delete at revision %d, want 6", rev)
	}
	if rev := mustRev(s.Delete(ctx, "never-was")); rev != 6 {
		t.Fatalf("Delete of no bin at revision %d, want 6 (no event)", rev)
	}
	if got, err := s.Peek(ctx, "never-was"); err != nil || len(got) != 0 {
		t.Fatalf("Peek of no bin = %d items, %v", len(got), err)
	}
}

func TestStore_PeekReturnsCopies(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{})
	if _, err := s.Put(ctx, "b", itemTD(t, 7, 4)); err != nil {
		t.Fatal(err)
	}
	p, err := s.Peek(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	x, _ := p[0].Tensor("x")
	if err := x.Fill(nil, 99); err != nil {
		t.Fatal(err)
	}
	p, _ = s.Peek(ctx, "b")
	if got := ids(t, p); got[0] != 7 {
		t.Fatal("writing a peeked item changed the stored one")
	}
}

func TestStore_ReopenKeepsEverything(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	o := Options{InlineBytes: 256} // items of 64 int64s and more are prefixes
	s, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := s.Append(ctx, "b", itemTD(t, int64(i), 4+i*10)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Put(ctx, "c", itemTD(t, 100, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Publish(ctx, "p", itemTD(t, 5, 8)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, o)
	counts, rev, err := s.List(ctx)
	if err != nil || rev != 12 || counts["b"] != 10 || counts["c"] != 1 {
		t.Fatalf("after reopening: %v at %d, %v", counts, rev, err)
	}
	got, err := s.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if g := ids(t, got); !slices.Equal(g, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatalf("Get after reopening = %v", g)
	}
	p, err := s.Latest(ctx, "p")
	if err != nil || p.Version != 1 {
		t.Fatalf("Latest after reopening: %v %v", p, err)
	}
	idOf(t, p.TD)
	p.Close()
	if rev, _ := s.Append(ctx, "b", itemTD(t, 1, 1)); rev != 14 {
		t.Fatalf("next revision %d, want 14", rev)
	}
}

func TestStore_Names(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{})
	for _, name := range []string{"", "a/b", "/", "..", ".", "a\x00b", "a\\b", "tab\there", strings.Repeat("x", 10_000), "\xff"} {
		_, err := s.Put(ctx, name, itemTD(t, 1, 1))
		if !errors.Is(err, ErrName) {
			t.Errorf("Put(%.20q) = %v, want ErrName", name, err)
		}
		if _, err := s.Publish(ctx, name, itemTD(t, 1, 1)); !errors.Is(err, ErrName) {
			t.Errorf("Publish(%.20q) = %v, want ErrName", name, err)
		}
		if err != nil && len(err.Error()) > 200 {
			t.Errorf("error message of %d bytes for a long name", len(err.Error()))
		}
	}
	for _, name := range []string{"a..b", "rollouts", "ünïcode", "with space", strings.Repeat("y", MaxNameBytes)} {
		if _, err := s.Put(ctx, name, itemTD(t, 1, 1)); err != nil {
			t.Errorf("Put(%.20q) = %v", name, err)
		}
	}
	if st := s.Stats(); st.Revision != 5 {
		t.Errorf("revision %d after refused names, want 5", st.Revision)
	}
}

func TestStore_TooLarge(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{MaxValueBytes: 800})
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 101)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append of 808 bytes = %v, want ErrTooLarge", err)
	}
	if _, err := s.Publish(ctx, "p", itemTD(t, 1, 101)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Publish of 808 bytes = %v, want ErrTooLarge", err)
	}
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 100)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Items != 1 || st.Revision != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStore_Locked(t *testing.T) {
	dir := t.TempDir()
	openT(t, dir, Options{})
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
}

func TestStore_Options(t *testing.T) {
	for _, o := range []Options{{MaxValueBytes: -1}, {InlineBytes: 65 << 20}, {History: -1}} {
		if _, err := Open(t.TempDir(), o); !errors.Is(err, ErrConfig) {
			t.Errorf("Open(%+v) = %v, want ErrConfig", o, err)
		}
	}
}

func TestStore_PrefixValues(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{InlineBytes: 64})
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "b", itemTD(t, 2, 2)); err != nil { // 16 bytes: inline
		t.Fatal(err)
	}
	vals, _ := os.ReadDir(filepath.Join(dir, valuesDir))
	if len(vals) != 1 {
		t.Fatalf("%d prefixes under values/, want 1", len(vals))
	}
	got, err := s.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if x, _ := got[0].Tensor("x"); !x.Mapped() {
		t.Error("a prefix value came back unmapped")
	}
	if g := ids(t, got); !slices.Equal(g, []int64{1, 2}) { // readable after the files went
		t.Fatalf("Get = %v", g)
	}
	vals, _ = os.ReadDir(filepath.Join(dir, valuesDir))
	if len(vals) != 0 {
		t.Fatalf("%d prefixes under values/ after Get, want 0", len(vals))
	}
}

func TestStore_GetAckConflicts(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{})
	s.Append(ctx, "b", itemTD(t, 1, 1))
	s.Append(ctx, "b", itemTD(t, 2, 1))
	tk, err := s.takeItems("b", true, time.Hour)
	if err != nil || len(tk.items) != 2 {
		t.Fatal(tk, err)
	}
	// A second Get sees only what arrives after the first took its items.
	s.Append(ctx, "b", itemTD(t, 3, 1))
	tk2, _ := s.takeItems("b", true, time.Hour)
	if len(tk2.items) != 1 || tk2.items[0].id == tk.items[0].id {
		t.Fatalf("the second Get took %d items", len(tk2.items))
	}
	// Peek sees all three.
	if p, _ := s.Peek(ctx, "b"); len(p) != 3 {
		t.Fatalf("Peek = %d items, want 3", len(p))
	}
	// A Put replaces them: both acknowledgements fail, nothing is removed.
	s.Put(ctx, "b", itemTD(t, 4, 1))
	if _, err := s.ackTake(tk.id); !errors.Is(err, ErrExpired) {
		t.Fatalf("ack after Put = %v, want ErrExpired", err)
	}
	if _, err := s.ackTake(tk2.id); !errors.Is(err, ErrExpired) {
		t.Fatalf("ack after Put = %v, want ErrExpired", err)
	}
	if p, _ := s.Peek(ctx, "b"); !slices.Equal(ids(t, p), []int64{4}) {
		t.Fatal("the Put's item is not the bin's content")
	}
	// An acknowledgement retried is answered again.
	tk3, _ := s.takeItems("b", true, time.Hour)
	r1, err := s.ackTake(tk3.id)
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := s.ackTake(tk3.id); err != nil || r2 < r1 {
		t.Fatalf("retried ack = %d, %v", r2, err)
	}
}

func TestStore_GetExpires(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{GetTimeout: 50 * time.Millisecond})
	s.Append(ctx, "b", itemTD(t, 1, 1))
	tk, _ := s.takeItems("b", true, 50*time.Millisecond)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if s.Stats().Gets == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Get never expired")
		}
	}
	if _, err := s.ackTake(tk.id); !errors.Is(err, ErrExpired) {
		t.Fatalf("late ack = %v, want ErrExpired", err)
	}
	got, err := s.Get(ctx, "b")
	if err != nil || !slices.Equal(ids(t, got), []int64{1}) {
		t.Fatalf("Get after the expiry: %v", err)
	}
}

func TestStore_Compaction(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	o := Options{CompactBytes: 64 << 10, History: 10, InlineBytes: 4096}
	s, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	var want []int64
	for i := range 400 {
		if _, err := s.Append(ctx, "b", itemTD(t, int64(i), 100)); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := s.Get(ctx, "b"); err != nil {
				t.Fatal(err)
			}
			want = nil
		} else {
			want = append(want, int64(i))
		}
		if i%50 == 0 {
			s.Publish(ctx, "p", itemTD(t, int64(i), 200)) // prefixes: 1600 bytes
		}
	}
	st := s.Stats()
	if st.LogBytes > 4*o.CompactBytes {
		t.Fatalf("log of %d bytes: never compacted", st.LogBytes)
	}
	s.Close()
	s = openT(t, dir, o)
	if st2 := s.Stats(); st2.Revision != st.Revision {
		t.Fatalf("revision %d after reopening, was %d", st2.Revision, st.Revision)
	}
	p, _ := s.Peek(ctx, "b")
	if g := ids(t, p); !slices.Equal(g, want) {
		t.Fatalf("after compaction and reopening the bin holds %v, want %v", g, want)
	}
	lp, err := s.Latest(ctx, "p")
	if err != nil || lp.Version != 8 || idOf(t, lp.TD) != 350 {
		t.Fatalf("Latest after reopening: %+v %v", lp, err)
	}
	lp.Close()
	// The events before the compaction are gone: a watcher from 0 is told.
	for _, err := range s.Watch(ctx, "", 0) {
		if !errors.Is(err, ErrCompacted) {
			t.Fatalf("Watch from 0 = %v, want ErrCompacted", err)
		}
		break
	}
}

func TestStore_TornTailIsCut(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s, _ := Open(dir, Options{})
	s.Append(ctx, "b", itemTD(t, 1, 10))
	s.Append(ctx, "b", itemTD(t, 2, 10))
	s.Close()
	path := filepath.Join(dir, logName)
	data, _ := os.ReadFile(path)
	for _, tail := range [][]byte{
		[]byte("TW"), // a frame header cut short
		append([]byte(recordMagic), 0xff, 0, 0, 0, 1, 2, 3, 4), // a record cut short
		make([]byte, 100), // zeros
	} {
		os.WriteFile(path, append(slices.Clone(data), tail...), 0o644)
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatalf("torn tail %q: %v", tail[:2], err)
		}
		counts, rev, _ := s.List(ctx)
		if counts["b"] != 2 || rev != 2 {
			t.Fatalf("after a torn tail: %v at %d", counts, rev)
		}
		s.Close()
		if fi, _ := os.Stat(path); fi.Size() != int64(len(data)) {
			t.Fatalf("the log is %d bytes after Open, want %d (tail cut)", fi.Size(), len(data))
		}
	}
}

func TestStore_DamageBeforeGoodRecordsIsCorrupt(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s, _ := Open(dir, Options{})
	s.Append(ctx, "b", itemTD(t, 1, 10))
	first := s.Stats().LogBytes
	s.Append(ctx, "b", itemTD(t, 2, 10))
	s.Close()
	path := filepath.Join(dir, logName)
	data, _ := os.ReadFile(path)
	data[first-20] ^= 0xff // the first append's payload: a good record follows it
	os.WriteFile(path, data, 0o644)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of a log damaged before good records = %v, want ErrCorrupt", err)
	}
	if got, _ := os.ReadFile(path); !slices.Equal(got, data) {
		t.Fatal("Open changed a log it refused")
	}
}

// writeLog writes a log of the given records (revision 1, 2, ...) after a
// base record.
func writeLog(t *testing.T, dir string, recs ...*record) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	data := []byte(logMagic)
	base, _ := prepare(&record{Op: recBase, Name: "0123456789abcdef"})
	data = append(data, base.seal(0)...)
	for i, rec := range recs {
		p, err := prepare(rec)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, p.seal(uint64(i+1))...)
	}
	if err := os.WriteFile(filepath.Join(dir, logName), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStore_RecordWithoutValueIsCorrupt: a record with a good checksum that
// the store never writes (a publish of no value) is ErrCorrupt, not a
// panic in the replay.
func TestStore_RecordWithoutValueIsCorrupt(t *testing.T) {
	for _, rec := range []*record{
		{Op: recPublish, Name: "p", Version: 1},
		{Op: recAppend, Name: "b"},
		{Op: recPut, Name: "a/b", Items: []recItem{{ID: 1, Inline: []byte("x")}}},
		{Op: 99, Name: "b"},
	} {
		dir := t.TempDir()
		writeLog(t, dir, rec)
		if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Open of a log with %+v = %v, want ErrCorrupt", rec, err)
		}
	}
}

// TestStore_DamagedLengthAllocatesLittle: a record whose length field says
// 1 GiB in a file of a few hundred bytes is a torn tail, found without
// allocating the gigabyte.
func TestStore_DamagedLengthAllocatesLittle(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, &record{Op: recAppend, Name: "b", Items: []recItem{{ID: 1, Inline: mustEncode(t, itemTD(t, 1, 4))}}})
	path := filepath.Join(dir, logName)
	data, _ := os.ReadFile(path)
	tail := append([]byte(recordMagic), 0, 0, 0, 0x3f, 0, 0, 0, 0) // length 1 GiB - 16 MiB
	os.WriteFile(path, append(data, tail...), 0o644)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s, err := Open(dir, Options{})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20 {
		t.Fatalf("Open allocated %d MB for a log of %d bytes", n>>20, len(data)+len(tail))
	}
	if st := s.Stats(); st.Items != 1 {
		t.Fatalf("%d items after the torn tail, want 1", st.Items)
	}
}

func mustEncode(t *testing.T, td *tensordict.TensorDict) []byte {
	t.Helper()
	b, err := encodeValue(td)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStore_CloseWithOperationsInFlight: Close while appends are in flight
// returns, and so does every append: each was written and synced, or
// refused with ErrClosed.
func TestStore_CloseWithOperationsInFlight(t *testing.T) {
	for round := range 25 {
		o := Options{}
		if round >= 20 { // values written as prefixes, through the store's folder
			o.InlineBytes, o.NoSync = 64, true
		}
		s, err := Open(t.TempDir(), o)
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					if _, err := s.Append(ctx, "b", itemTD(t, int64(g*1000+i), 16+100*(round/20))); err != nil {
						if !errors.Is(err, ErrClosed) {
							errs <- err
						}
						return
					}
				}
			})
		}
		for s.Stats().Revision < 50 {
			time.Sleep(time.Millisecond)
		}
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for _, ch := range []<-chan struct{}{done} {
			select {
			case <-ch:
			case <-time.After(30 * time.Second):
				t.Fatal("appends still blocked 30 s after Close")
			}
		}
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Close did not return within 30 s")
		}
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}
