package faulttest

import (
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/replay"
)

// The checker must catch what it is there to catch.
func TestJudge(t *testing.T) {
	log := func() *batchLog {
		l := &batchLog{begun: map[int64]int{}, acked: map[int64]bool{}}
		for _, first := range []int64{transitionID(0, 0, 0), transitionID(0, 0, 2), transitionID(1, 3, 0)} {
			l.begun[first] = 2
		}
		l.acked[transitionID(0, 0, 0)] = true
		l.acked[transitionID(1, 3, 0)] = true
		return l
	}
	a0, a1 := transitionID(0, 0, 0), transitionID(0, 0, 1)
	u0, u1 := transitionID(0, 0, 2), transitionID(0, 0, 3)
	b0, b1 := transitionID(1, 3, 0), transitionID(1, 3, 1)
	for _, tc := range []struct {
		name string
		held []int64
		want verdict
		ok   bool
	}{
		{"exactly the acked", []int64{a0, a1, b0, b1}, verdict{Acked: 4, Held: 4}, true},
		{"and a whole batch in flight", []int64{a0, a1, u0, b0, u1, b1}, verdict{Acked: 4, Held: 6, InFlight: 1}, true},
		{"an acked one lost", []int64{a0, b0, b1}, verdict{Acked: 4, Held: 3, Lost: 1}, false},
		{"a duplicate", []int64{a0, a1, a1, b0, b1}, verdict{Acked: 4, Held: 5, Duplicated: 1}, false},
		{"half a batch in flight", []int64{a0, a1, u1, b0, b1}, verdict{Acked: 4, Held: 5, Partial: 1}, false},
		{"one nobody wrote", []int64{a0, a1, b0, b1, transitionID(2, 0, 0)}, verdict{Acked: 4, Held: 5, Unknown: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := judge(log(), tc.held)
			if got != tc.want || got.ok() != tc.ok {
				t.Fatalf("judge = %+v (ok %v), want %+v (ok %v)", got, got.ok(), tc.want, tc.ok)
			}
		})
	}
}

func TestTornRows(t *testing.T) {
	td := transitions(transitionID(0, 1, 0), 4)
	if n, err := tornRows(td); err != nil || n != 0 {
		t.Fatalf("whole rows: %d torn, %v", n, err)
	}
	obs, _ := td.Tensor("obs")
	b, _ := obs.Bytes()
	b[2*obsWidth*8+5] ^= 1 // one byte of row 2
	if n, err := tornRows(td); err != nil || n != 1 {
		t.Fatalf("one row changed: %d torn, %v", n, err)
	}
}

// The episode checker must catch what it is there to catch, and the slice
// checker a slice that crosses an episode or skips a step.
func TestJudgeEpisodes(t *testing.T) {
	log := func() *episodeLog {
		l := &episodeLog{begun: map[int64]map[int]int{}, acked: map[int64]map[int]bool{}}
		l.begun[1] = map[int]int{0: 2, 2: 3, 5: 1} // acked [0, 5), [5, 6) in flight
		l.acked[1] = map[int]bool{0: true, 2: true}
		l.begun[2] = map[int]int{0: 4}
		l.acked[2] = map[int]bool{0: true}
		return l
	}
	held := func(steps ...[]int64) map[int64]heldEpisode {
		return map[int64]heldEpisode{1: {steps: steps[0]}, 2: {steps: steps[1]}}
	}
	for _, tc := range []struct {
		name        string
		held        map[int64]heldEpisode
		overwritten bool
		want        episodeVerdict
		ok          bool
	}{
		{"exactly the acked", held([]int64{0, 1, 2, 3, 4}, []int64{0, 1, 2, 3}), false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 9}, true},
		{"and a call in flight, whole", held([]int64{0, 1, 2, 3, 4, 5}, []int64{0, 1, 2, 3}), false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 10, InFlight: 1}, true},
		{"an acked step lost at the end", held([]int64{0, 1, 2, 3}, []int64{0, 1, 2, 3}), false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 8, Lost: 1}, false},
		{"an episode lost", map[int64]heldEpisode{1: {steps: []int64{0, 1, 2, 3, 4}}}, false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 5, Lost: 4}, false},
		{"steps out of order", held([]int64{0, 2, 1, 3, 4}, []int64{0, 1, 2, 3}), false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 9, Misplaced: 1}, false},
		{"a hole", held([]int64{0, 1, -1, 3, 4}, []int64{0, 1, 2, 3}), false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 9, Misplaced: 1}, false},
		{"a step twice", held([]int64{0, 1, 2, 2, 3, 4}, []int64{0, 1, 2, 3}), false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 10, Misplaced: 1}, false},
		{"the start missing", held([]int64{1, 2, 3, 4}, []int64{0, 1, 2, 3}), false,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 8, Misplaced: 1}, false},
		{"the start overwritten, allowed", held([]int64{1, 2, 3, 4}, []int64{0, 1, 2, 3}), true,
			episodeVerdict{Episodes: 2, Acked: 9, Held: 8, Overwrites: 1}, true},
		{"an episode nobody began", map[int64]heldEpisode{1: {steps: []int64{0, 1, 2, 3, 4}}, 2: {steps: []int64{0, 1, 2, 3}},
			7: {steps: []int64{0}}}, false, episodeVerdict{Episodes: 2, Acked: 9, Held: 9, Unknown: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := judgeEpisodes(log(), tc.held, tc.overwritten)
			if got != tc.want || got.ok() != tc.ok {
				t.Fatalf("judgeEpisodes = %+v (ok %v), want %+v (ok %v)", got, got.ok(), tc.want, tc.ok)
			}
		})
	}
	l := log()
	l.begun[2][4] = 4
	if got := judgeEpisodes(l, held([]int64{0, 1, 2, 3, 4}, []int64{0, 1, 2, 3, 4, 5}), false); got.Partial != 1 || got.ok() {
		t.Fatalf("an episode ending inside a call: %+v", got)
	}
}

func TestCheckSliceSample(t *testing.T) {
	td := episodeSteps(7, 0, 4)
	info := replay.SliceInfo{Episodes: []int64{7, 7}}
	if err := checkSliceSample(td, info, 2); err != nil {
		t.Fatalf("two slices of episode 7: %v", err)
	}
	if err := checkSliceSample(td, replay.SliceInfo{Episodes: []int64{7, 8}}, 2); err == nil {
		t.Fatal("a slice of episode 8 holding steps of 7 passed")
	}
	if err := checkSliceSample(episodeSteps(7, 0, 4), info, 4); err == nil {
		t.Fatal("4 rows taken for 2 slices of 4 passed")
	}
	st, _ := td.Tensor("step")
	b, _ := st.Bytes()
	b[8] = 5 // row 1 says step 5
	if err := checkSliceSample(td, replay.SliceInfo{Episodes: []int64{7}}, 4); err == nil || !strings.Contains(err.Error(), "torn") {
		t.Fatalf("a torn row: %v", err)
	}
	// Whole rows, but a step skipped: steps 0, 1, 3, 4.
	gap := episodeSteps(7, 0, 4)
	for _, k := range []string{"step", "obs"} {
		from, _ := episodeSteps(7, 3, 5).Tensor(k)
		to, _ := gap.Tensor(k)
		fb, _ := from.Bytes()
		tb, _ := to.Bytes()
		copy(tb[len(tb)/2:], fb)
	}
	if err := checkSliceSample(gap, replay.SliceInfo{Episodes: []int64{7}}, 4); err == nil || !strings.Contains(err.Error(), "step 3 after step 1") {
		t.Fatalf("a step skipped: %v", err)
	}
}
