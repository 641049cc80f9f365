package replay

import (
	"errors"
	"slices"
	"testing"
)

func TestObsChecks(t *testing.T) {
	if obsChecks[0] != 0 || obsChecks[len(obsChecks)-1] != obsBytes-8 {
		t.Errorf("checked words %v..%v, want both ends of the row", obsChecks[0], obsChecks[len(obsChecks)-1])
	}
	for i := 1; i < len(obsChecks); i++ {
		if d := obsChecks[i] - obsChecks[i-1]; d <= 0 || d > obsStride {
			t.Fatalf("checked words at %d and %d", obsChecks[i-1], obsChecks[i])
		}
	}
	if got := TransitionBytes; got != 28237 {
		t.Errorf("TransitionBytes = %d", got)
	}
}

func TestBatch_StampVerify(t *testing.T) {
	ids := []uint64{
		transitionID(0, 0), transitionID(0, 1), transitionID(1, 0),
		transitionID(7, 1<<24+3), transitionID(1000, 1<<39),
	}
	b, err := newBatch(len(ids))
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		b.stamp(i, id)
	}
	for i, want := range ids {
		if id, err := b.verify(i); id != want || err != nil {
			t.Errorf("row %d: verify = %#x, %v; want %#x", i, id, err, want)
		}
	}
	if got := b.td.NumBytes(); got != len(ids)*TransitionBytes {
		t.Errorf("a batch of %d is %d bytes", len(ids), got)
	}
}

// TestBatch_TornDetected mixes transition B (row 1) into transition A
// (row 0) in every way a torn copy could, and checks that verify refuses
// row 0.
func TestBatch_TornDetected(t *testing.T) {
	a, bID := transitionID(0, 41), transitionID(1, 42) // of opposite parity
	mixes := []struct {
		name string
		mix  func(b *batch)
	}{
		{"obs first word", func(b *batch) { copyObs(b, 0, 8) }},
		{"obs first half", func(b *batch) { copyObs(b, 0, obsBytes/2) }},
		{"obs second half", func(b *batch) { copyObs(b, obsBytes/2, obsBytes) }},
		{"obs last word", func(b *batch) { copyObs(b, obsBytes-8, obsBytes) }},
		{"obs a page in the middle", func(b *batch) { copyObs(b, 8192, 8192+4096) }},
		{"obs one checked word in the middle", func(b *batch) { copyObs(b, 5*obsStride, 5*obsStride+8) }},
		{"obs all but the ends", func(b *batch) { copyObs(b, 8, obsBytes-8) }},
		{"obs shifted by a word", func(b *batch) { copy(b.obs[8:obsBytes], b.obs[:obsBytes-8]) }},
		{"obs whole, of B", func(b *batch) { copyObs(b, 0, obsBytes) }},
		{"action", func(b *batch) { copy(b.action[:8], b.action[8:16]) }},
		{"reward", func(b *batch) { copy(b.reward[:4], b.reward[4:8]) }},
		{"done", func(b *batch) { b.done[0] = b.done[1] }},
		{"done not a bool", func(b *batch) { b.done[0] = 2 + b.done[0] }},
		{"nothing written", func(b *batch) {
			clear(b.obs[:obsBytes])
			clear(b.action[:8])
			clear(b.reward[:4])
			b.done[0] = 0
		}},
	}
	for _, m := range mixes {
		t.Run(m.name, func(t *testing.T) {
			b, err := newBatch(2)
			if err != nil {
				t.Fatal(err)
			}
			b.stamp(0, a)
			b.stamp(1, bID)
			m.mix(b)
			if id, err := b.verify(0); !errors.Is(err, errTorn) {
				t.Errorf("verify = %#x, %v; want a torn row", id, err)
			}
			if _, err := b.verify(1); err != nil {
				t.Errorf("row 1 (untouched): %v", err)
			}
		})
	}
}

// copyObs copies bytes [from, to) of row 1's obs over row 0's.
func copyObs(b *batch, from, to int) {
	copy(b.obs[from:to], b.obs[obsBytes+from:obsBytes+to])
}

func TestSchema(t *testing.T) {
	b, err := newBatch(3)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	size := 0
	for _, f := range Schema() {
		keys = append(keys, f.Key[0])
		n := f.DType.Size()
		for _, d := range f.Shape {
			n *= d
		}
		size += n
	}
	if !slices.Equal(keys, []string{"obs", "action", "reward", "done"}) || size != TransitionBytes {
		t.Errorf("schema keys %v, %d bytes per transition", keys, size)
	}
	if b.td.Len() != 3 || len(b.obs) != 3*obsBytes || len(b.action) != 24 || len(b.reward) != 12 || len(b.done) != 3 {
		t.Errorf("batch of 3: %v; leaves %d, %d, %d, %d bytes", b.td.BatchSize(), len(b.obs), len(b.action), len(b.reward), len(b.done))
	}
}
