package serve

import (
	"bytes"
	"encoding/binary"
	"math"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorwire/tensorwire/internal/shm"
)

// The node reads its clients' rings: bytes another process writes, and
// may write anything into (bell.go). FuzzBellRing gives the node's poller
// (scanRing) a ring whose head, tail and entries are the fuzzer's, for a
// client of 1 to 8 slots, and checks that the node
//
//   - never panics;
//   - writes nothing in the ring but its head and the records of the
//     client's slots (done, status, version), nothing past the ring's end;
//   - writes outputs only into the rows of entries that ask for rows of
//     the client's slots, and there only the model's outputs of those rows;
//   - answers every entry whose first row is a slot (its record's done is
//     the sequence number of an entry for that row), keeps at most one
//     failure per slot, and holds no reference on the client once every
//     request is answered;
//   - refuses a ring that holds more entries than slots, or an entry whose
//     first row is not a slot (there is no record to answer it in), with
//     an error: the poller drops the client's registration.

// fuzzRing is the fuzz target's manager, made once per process.
var fuzzRing struct {
	once sync.Once
	m    *Manager
	err  error
}

// fuzzRingGuard is how many bytes past the ring's end are checked.
const fuzzRingGuard = 4096

// fuzzSentinel fills the output rows the node has not written.
const fuzzSentinel = float32(-12345)

func FuzzBellRing(f *testing.F) {
	entry := func(start, n int, seq uint32) []byte {
		return binary.LittleEndian.AppendUint64(nil, makeEntry(start, n, seq))
	}
	// slots-1, head, tail, then entries.
	seed := func(slots byte, head, tail uint64, entries ...[]byte) []byte {
		b := []byte{slots - 1}
		b = binary.LittleEndian.AppendUint64(b, head)
		b = binary.LittleEndian.AppendUint64(b, tail)
		return append(b, bytes.Join(entries, nil)...)
	}
	f.Add(seed(4, 0, 2, entry(0, 2, 1), entry(2, 2, 1)))                 // two good requests
	f.Add(seed(4, 0, 3, entry(3, 2, 1), entry(0, 5, 2), entry(1, 0, 3))) // past the slots, past the max batch, no rows
	f.Add(seed(4, 0, 1, entry(100, 1, 1)))                               // a first row that is not a slot
	f.Add(seed(8, 0, 2, entry(2_000_000, 4, 7), entry(0, 1, 0)))         // far outside; sequence number 0
	f.Add(seed(4, 0, 9, entry(0, 1, 1)))                                 // more entries than slots
	f.Add(seed(4, 10, 3))                                                // tail behind head
	f.Add(seed(1, math.MaxUint64, 1, entry(0, 1, 1)))                    // tail wrapped past head
	f.Add(seed(8, 5, 9, entry(1, 1, 1), entry(1, 1, 2), entry(1, 3, 3))) // the same row again
	f.Add(seed(2, 0, 2, entry(1, 1, entrySeqMask), entry(1, 2, 1<<21)))  // big sequence numbers
	f.Fuzz(func(t *testing.T, data []byte) {
		if !bellSupported {
			t.Skip("the bell needs Linux")
		}
		if len(data) < 17 {
			return
		}
		fuzzRing.once.Do(func() {
			fuzzRing.m, fuzzRing.err = New(testConfig(&behaviour{}, 4))
		})
		if fuzzRing.err != nil {
			t.Fatal(fuzzRing.err)
		}
		m := fuzzRing.m
		slots := 1 + int(data[0])%8
		head, tail := binary.LittleEndian.Uint64(data[1:]), binary.LittleEndian.Uint64(data[9:])
		entries := data[17:]

		// The client's slots, in Go memory: input row i holds i.
		in, err := testIn.Zeros(slots)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := in.Tensor("x")
		xb, _ := x.Bytes()
		xs := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(xb))), len(xb)/4)
		for i := range xs {
			xs[i] = float32(i / 4)
		}
		out, err := testOut.Zeros(slots)
		if err != nil {
			t.Fatal(err)
		}
		y, _ := out.Tensor("y")
		yb, _ := y.Bytes()
		ys := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(yb))), len(yb)/4)
		for i := range ys {
			ys[i] = fuzzSentinel
		}

		// The ring, 64-byte aligned, with a guard after it; the entries
		// area is filled from the fuzzer's bytes, the rest of the ring
		// with a pattern the node must leave alone.
		size, records := ringSize(slots)
		mem := make([]byte, size+fuzzRingGuard+64)
		off := int((64 - uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%64) % 64)
		all := mem[off : off+size+fuzzRingGuard]
		for i := range all {
			all[i] = byte(i*7 + 1)
		}
		for s := range slots { // records start empty: done 0, no waiters
			clear(all[records+recordSize*s : records+recordSize*(s+1)])
		}
		v, err := newRingView(shm.Over(all[:size]), slots)
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(all[ringHead:], head)
		binary.LittleEndian.PutUint64(all[ringTail:], tail)
		ents := all[ringEntries : ringEntries+8*slots]
		copy(ents, entries)
		before := bytes.Clone(all)

		s := &served{name: "model", m: m, lease: time.Minute, clients: map[uint64]*registration{}}
		r := &registration{id: 1, prefix: ClientsDir + "/0000000000000001", slots: slots, in: in, out: out, ring: v}
		if r.inF, err = fieldsOf(in, testIn); err != nil {
			t.Fatal(err)
		}
		if r.outF, err = fieldsOf(out, testOut); err != nil {
			t.Fatal(err)
		}
		s.clients[r.id] = r

		n, scanErr := s.scanRing(r)

		// Every request taken is answered: no reference is left.
		deadline := time.Now().Add(30 * time.Second)
		for {
			s.mu.Lock()
			refs := r.refs
			s.mu.Unlock()
			if refs == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d requests unanswered after 30 s", refs)
			}
			time.Sleep(time.Millisecond)
		}

		// What the node took: entries [head, head+n).
		taken := make([][3]int, 0, n)
		for i := range uint64(n) {
			e := binary.LittleEndian.Uint64(ents[8*int((head+i)%uint64(slots)):])
			start, rows, seq := splitEntry(e)
			taken = append(taken, [3]int{start, rows, int(seq)})
		}
		if got := v.head().Load(); got != head+uint64(n) {
			t.Fatalf("head %d after taking %d entries from %d", got, n, head)
		}
		switch {
		case tail-head > uint64(slots):
			if scanErr == nil || n != 0 {
				t.Fatalf("a ring of %d entries in %d slots: %d taken, error %v", tail-head, slots, n, scanErr)
			}
		case scanErr == nil && uint64(n) != tail-head:
			t.Fatalf("%d of %d entries taken, and no error", n, tail-head)
		case scanErr != nil:
			e := binary.LittleEndian.Uint64(ents[8*int((head+uint64(n))%uint64(slots)):])
			if start, _, _ := splitEntry(e); start < slots {
				t.Fatalf("the ring refused (%v) at entry %d, for rows from %d of %d slots", scanErr, n, start, slots)
			}
		}

		// The ring: only the head and the records of the slots changed,
		// and of those no waiters word; nothing after the ring.
		for i := range all {
			inRecord := i >= records && i < records+recordSize*slots
			if i >= ringHead && i < ringHead+8 || inRecord && (i-records)%recordSize != 8 && (i-records)%recordSize < 12 ||
				inRecord && (i-records)%recordSize >= 16 && (i-records)%recordSize < 24 {
				continue
			}
			if all[i] != before[i] {
				t.Fatalf("the node wrote byte %d of a ring of %d bytes (%d slots, records at %d): %d, was %d",
					i, size, slots, records, all[i], before[i])
			}
		}
		for _, e := range taken {
			if e[0] >= slots {
				t.Fatalf("an entry for row %d of %d slots was taken; error %v", e[0], slots, scanErr)
			}
		}
		// Each record names an entry taken for its row, or none.
		for slot := range slots {
			done := v.done(slot).Load()
			if done == 0 {
				continue
			}
			found := false
			for _, e := range taken {
				found = found || e[0] == slot && uint32(e[2]) == done
			}
			if !found {
				t.Fatalf("record %d says request %d done; taken %v", slot, done, taken)
			}
		}
		s.mu.Lock()
		failures := len(r.failures)
		s.mu.Unlock()
		if failures > slots {
			t.Fatalf("%d failures kept for %d slots", failures, slots)
		}

		// The outputs: only rows asked for, and the model's outputs there.
		asked := make([]bool, slots)
		for _, e := range taken {
			if e[1] >= 1 && e[1] <= m.cfg.MaxBatch && e[0] >= 0 && e[0] <= slots-e[1] {
				for i := e[0]; i < e[0]+e[1]; i++ {
					asked[i] = true
				}
			}
		}
		for row := range slots {
			got := ys[2*row]
			if got == fuzzSentinel {
				continue
			}
			if !asked[row] {
				t.Fatalf("output row %d written (%v), though no entry asked for it; taken %v", row, got, taken)
			}
			if want := float32(4 * row); got != want {
				t.Fatalf("output row %d: %v, want %v", row, got, want)
			}
		}
	})
}
