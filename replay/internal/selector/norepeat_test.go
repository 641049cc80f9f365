package selector

import (
	"maps"
	"slices"
	"testing"
)

// insertSlots inserts slots into s and returns them as a set.
func insertSlots(s Selector, slots ...int) map[int]bool {
	set := map[int]bool{}
	for _, slot := range slots {
		s.Insert(slot, 0, 1)
		set[slot] = true
	}
	return set
}

// selectAll selects the batches of sizes ns in turn and returns all the
// slots, in order, each batch also checked for being n slots.
func selectAll(t *testing.T, s Selector, seed uint64, ns ...int) []int {
	t.Helper()
	rng := newRand(seed)
	var all []int
	for _, n := range ns {
		got, _, err := s.Select(rng, n, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != n {
			t.Fatalf("Select(%d) returned %d slots", n, len(got))
		}
		all = append(all, got...)
	}
	return all
}

// checkEpochs checks that seq is a run of permutations of want, one after
// the other (the last possibly partial), and returns how many it saw whole.
func checkEpochs(t *testing.T, seq []int, want map[int]bool) int {
	t.Helper()
	k := len(want)
	for start := 0; start < len(seq); start += k {
		chunk := seq[start:min(start+k, len(seq))]
		seen := map[int]bool{}
		for _, slot := range chunk {
			if !want[slot] || seen[slot] {
				t.Fatalf("epoch at %d of %v: slot %d absent or repeated (want each of %v once)",
					start, seq, slot, slices.Sorted(maps.Keys(want)))
			}
			seen[slot] = true
		}
	}
	return len(seq) / k
}

func TestWithoutReplacement_EachOncePerEpoch(t *testing.T) {
	present := []int{0, 2, 3, 5, 7, 8, 11, 12, 13, 14, 16, 18, 19} // 13 of 20
	for _, tc := range []struct {
		name    string
		batches []int
	}{
		{"whole", []int{13, 13, 13}},
		{"ones", slices.Repeat([]int{1}, 39)},
		{"fives", slices.Repeat([]int{5}, 8)},
		{"ragged", []int{4, 4, 4, 1, 7, 6, 2, 11}},
		{"spanning", []int{10, 10, 10, 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := WithoutReplacement(20)
			want := insertSlots(s, present...)
			seq := selectAll(t, s, 1, tc.batches...)
			if epochs := checkEpochs(t, seq, want); epochs < 3 {
				t.Fatalf("saw %d whole epochs, want 3", epochs)
			}
			if slices.Equal(seq[:13], seq[13:26]) {
				t.Errorf("two epochs in the same order %v: not shuffled", seq[:13])
			}
		})
	}
}

// TestWithoutReplacement_DistinctInBatch checks that a batch that runs an
// epoch out and starts the next still holds distinct slots when Len() >= n,
// and that the slots it set aside from the new epoch come later in it.
func TestWithoutReplacement_DistinctInBatch(t *testing.T) {
	for _, tc := range []struct{ len, n int }{
		{10, 7}, {10, 10}, {10, 9}, {13, 5}, {50, 49}, {3, 2}, {2, 2}, {1, 1},
	} {
		s := WithoutReplacement(64)
		slots := make([]int, tc.len)
		for i := range slots {
			slots[i] = 3 * i % 64
		}
		want := insertSlots(s, slots...)
		seq := selectAll(t, s, uint64(tc.len*100+tc.n), slices.Repeat([]int{tc.n}, 200)...)
		for b := 0; b < len(seq); b += tc.n {
			batch := slices.Sorted(slices.Values(seq[b : b+tc.n]))
			if len(slices.Compact(batch)) != tc.n {
				t.Fatalf("len %d, n %d: batch %v repeats a slot", tc.len, tc.n, seq[b:b+tc.n])
			}
		}
		checkEpochs(t, seq, want)
	}
}

// TestWithoutReplacement_LongBatch checks batches longer than Len(): slots
// repeat, but each epoch still returns each slot once.
func TestWithoutReplacement_LongBatch(t *testing.T) {
	for _, tc := range []struct{ len, n int }{{1, 4}, {3, 10}, {5, 12}, {4, 8}} {
		s := WithoutReplacement(8)
		slots := make([]int, tc.len)
		for i := range slots {
			slots[i] = i
		}
		want := insertSlots(s, slots...)
		seq := selectAll(t, s, 9, slices.Repeat([]int{tc.n}, 30)...)
		checkEpochs(t, seq, want)
	}
}

func TestWithoutReplacement_RemovedSkipped(t *testing.T) {
	s := WithoutReplacement(10)
	present := insertSlots(s, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	rng := newRand(4)
	first, _, _ := s.Select(rng, 3, nil, nil)
	// Remove one slot already returned and three not yet returned.
	removed := []int{first[0]}
	for slot := range 10 {
		if len(removed) < 4 && !slices.Contains(first, slot) {
			removed = append(removed, slot)
		}
	}
	for _, slot := range removed {
		s.Remove(slot)
		delete(present, slot)
	}
	rest, _, err := s.Select(rng, 4, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wantRest []int
	for slot := range 10 {
		if present[slot] && !slices.Contains(first, slot) {
			wantRest = append(wantRest, slot)
		}
	}
	if got := slices.Sorted(slices.Values(rest)); !slices.Equal(got, wantRest) {
		t.Errorf("rest of the epoch after removing %v: %v, want %v", removed, got, wantRest)
	}
	next, _, _ := s.Select(rng, 6, nil, nil)
	checkEpochs(t, next, present)
}

func TestWithoutReplacement_InsertedWaitForNextEpoch(t *testing.T) {
	s := WithoutReplacement(16)
	old := insertSlots(s, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	rng := newRand(8)
	first, _, _ := s.Select(rng, 3, nil, nil)
	// New slots, and a present slot not yet returned inserted again.
	again := 0
	for slices.Contains(first, again) {
		again++
	}
	s.Insert(again, 1, 1)
	s.Insert(12, 1, 1)
	s.Insert(15, 1, 1)
	rest, _, err := s.Select(rng, 6, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wantRest []int
	for slot := range 10 {
		if slot != again && !slices.Contains(first, slot) {
			wantRest = append(wantRest, slot)
		}
	}
	if got := slices.Sorted(slices.Values(rest)); !slices.Equal(got, wantRest) {
		t.Errorf("rest of the epoch: %v, want the old slots not yet returned %v", got, wantRest)
	}
	old[12], old[15] = true, true
	next, _, _ := s.Select(rng, 12, nil, nil)
	checkEpochs(t, next, old)
}

// TestWithoutReplacement_Shuffled checks that epochs are uniformly random:
// the ordered pair of slots an epoch starts with is uniform over all pairs.
func TestWithoutReplacement_Shuffled(t *testing.T) {
	const k = 8
	s := WithoutReplacement(k)
	for slot := range k {
		s.Insert(slot, 0, 1)
	}
	rng := newRand(21)
	counts := make([]int, k*k)
	want := make([]float64, k*k)
	for a := range k {
		for b := range k {
			if a != b {
				want[a*k+b] = 1
			}
		}
	}
	var got []int
	for range 30000 {
		got, _, _ = s.Select(rng, k, got[:0], nil)
		counts[got[0]*k+got[1]]++
	}
	checkProportions(t, counts, want)
}

// TestWithoutReplacement_Model runs random inserts, removes and one-slot
// selects, and checks each epoch against a model: no slot returned twice in
// it, and by its end every slot eligible in it (present at its start, not
// removed or inserted since) returned.
func TestWithoutReplacement_Model(t *testing.T) {
	const capacity = 32
	s := WithoutReplacement(capacity)
	w := s.(*withoutReplacement)
	rng := newRand(17)
	present := map[int]bool{}
	eligible := map[int]bool{} // eligible in the current epoch, not yet returned
	var epoch uint64
	epochs := 0
	for step := range 50000 {
		slot := rng.IntN(capacity)
		switch rng.IntN(4) {
		case 0:
			s.Insert(slot, 0, 1)
			present[slot] = true
			delete(eligible, slot)
		case 1:
			s.Remove(slot)
			delete(present, slot)
			delete(eligible, slot)
		default:
			if len(present) == 0 {
				break
			}
			before := maps.Clone(present)
			got, _, err := s.Select(rng, 1, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if w.epoch != epoch {
				if len(eligible) != 0 {
					t.Fatalf("step %d: epoch %d ended without returning %v", step, epoch, eligible)
				}
				epoch, eligible = w.epoch, before
				epochs++
			}
			if !eligible[got[0]] {
				t.Fatalf("step %d: returned slot %d, not eligible or already returned in epoch %d", step, got[0], epoch)
			}
			delete(eligible, got[0])
		}
	}
	if epochs < 100 {
		t.Errorf("only %d epochs", epochs)
	}
}
