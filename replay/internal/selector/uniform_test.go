package selector

import (
	"math/rand/v2"
	"testing"
)

// countDraws selects draws slots from s in batches of 1000 and counts them
// by slot, failing on any slot that is not present.
func countDraws(t *testing.T, s Selector, rng *rand.Rand, capacity, draws int) []int {
	t.Helper()
	counts := make([]int, capacity)
	var slots []int
	for done := 0; done < draws; done += 1000 {
		var err error
		slots, _, err = s.Select(rng, min(1000, draws-done), slots[:0], nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, slot := range slots {
			if !has(s, slot) {
				t.Fatalf("Select returned absent slot %d", slot)
			}
			counts[slot]++
		}
	}
	return counts
}

func TestUniform_Distribution(t *testing.T) {
	const capacity = 200
	for _, tc := range []struct {
		name    string
		insert  func(slot int) bool
		remove  func(slot int) bool
		draws   int
		seed    uint64
		wantLen int
	}{
		{"one", func(s int) bool { return s == 17 }, func(int) bool { return false }, 1000, 1, 1},
		{"two", func(s int) bool { return s == 0 || s == 199 }, func(int) bool { return false }, 20000, 2, 2},
		{"all", func(int) bool { return true }, func(int) bool { return false }, 200000, 3, 200},
		{"holes", func(s int) bool { return s%3 != 0 }, func(s int) bool { return s%7 == 0 }, 200000, 4, 114},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Uniform(capacity)
			want := make([]float64, capacity)
			for slot := range capacity {
				if tc.insert(slot) {
					s.Insert(slot, 0, 0)
					want[slot] = 1
				}
			}
			for slot := range capacity {
				if tc.remove(slot) {
					s.Remove(slot)
					want[slot] = 0
				}
			}
			if s.Len() != tc.wantLen {
				t.Fatalf("Len = %d, want %d", s.Len(), tc.wantLen)
			}
			checkProportions(t, countDraws(t, s, newRand(tc.seed), capacity, tc.draws), want)
		})
	}
}
