package collective

import (
	"slices"
	"testing"
)

// TestPipeSched_Numbers: the events of a pipelined collective, in the
// order a rank makes them (in(0) .. in(pipeSlots-2), then for each chunk
// in(c+pipeSlots-1) if there is such a chunk, red(c), and out(c) for the
// reduction), have the numbers protocol 2 gives them on the progress
// word (peers wait for these numbers): rising, the last one events().
func TestPipeSched_Numbers(t *testing.T) {
	order := func(l *pipeSched) []uint32 {
		var evs []uint32
		for c := range min(pipeSlots-1, l.k) {
			evs = append(evs, l.evIn(c))
		}
		for c := range l.k {
			if j := c + pipeSlots - 1; j < l.k {
				evs = append(evs, l.evIn(j))
			}
			evs = append(evs, l.evRed(c))
			if l.step == 3 {
				evs = append(evs, l.evOut(c))
			}
		}
		return evs
	}
	for _, tc := range []struct {
		step, k int
		want    []uint32
	}{
		{3, 1, []uint32{1, 3, 4}},
		{3, 3, []uint32{1, 2, 3, 4, 5, 6, 7, 9, 10}},
		{2, 1, []uint32{1, 3}},
		{2, 3, []uint32{1, 2, 3, 4, 5, 7}},
	} {
		l := &pipeSched{step: tc.step, k: tc.k}
		got := order(l)
		if !slices.Equal(got, tc.want) {
			t.Errorf("step %d, %d chunks: events %v, want %v", tc.step, tc.k, got, tc.want)
		}
		if last := got[len(got)-1]; l.events() != last {
			t.Errorf("step %d, %d chunks: events() %d, the last event %d", tc.step, tc.k, l.events(), last)
		}
	}
	for step := 2; step <= 3; step++ {
		for k := range 6 {
			l := &pipeSched{step: step, k: k}
			evs := order(l)
			for i := 1; i < len(evs); i++ {
				if evs[i] <= evs[i-1] {
					t.Errorf("step %d, %d chunks: events not rising: %v", step, k, evs)
					break
				}
			}
			if k > 0 && evs[len(evs)-1] != l.events() {
				t.Errorf("step %d, %d chunks: events() %d, the last event %d", step, k, l.events(), evs[len(evs)-1])
			}
			if k == 0 && l.events() != pipeSlots-1 {
				t.Errorf("step %d, no chunks: events() %d, want %d", step, l.events(), pipeSlots-1)
			}
		}
	}
}
