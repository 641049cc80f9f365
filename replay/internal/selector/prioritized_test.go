package selector

import (
	"math"
	"slices"
	"testing"
)

// q is (p + eps)^alpha, what the sum tree holds for priority p.
func q(p, alpha, eps float64) float64 { return math.Pow(p+eps, alpha) }

func TestPrioritized_Distribution(t *testing.T) {
	const capacity = 40
	// Priorities of the slots inserted (slot i has prio[i]; -1: not
	// inserted), then the updates applied and the slots removed before the
	// second round of draws.
	prio := []float64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0.5, -1, 20, 0.1, -1, 3.5, 11, 0, 1, 2}
	updates := map[int]float64{1: 9, 2: 0, 3: 30, 12: 0.25, 19: 2}
	removed := []int{4, 5, 15}
	for _, tc := range []struct {
		name       string
		alpha, eps float64
	}{
		{"alpha0", 0, 0.01},
		{"alpha0.6", 0.6, 0.01},
		{"alpha1", 1, 0.01},
		{"alpha0.6/eps0", 0.6, 0}, // slots of priority 0 are never picked
		{"alpha1/eps0", 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustPrioritized(capacity, tc.alpha, 0.5, tc.eps)
			want := make([]float64, capacity)
			for slot, p := range prio {
				if p >= 0 {
					s.Insert(slot, 0, p)
					want[slot] = q(p, tc.alpha, tc.eps)
				}
			}
			rng := newRand(11)
			checkProportions(t, countDraws(t, s, rng, capacity, 200000), want)

			t.Run("updated", func(t *testing.T) {
				for slot, p := range updates {
					s.Update(slot, p)
					want[slot] = q(p, tc.alpha, tc.eps)
				}
				for _, slot := range removed {
					s.Remove(slot)
					want[slot] = 0 // so checkProportions wants no draws
				}
				checkProportions(t, countDraws(t, s, rng, capacity, 200000), want)
			})
		})
	}
}

// TestPrioritized_Weights checks the weights against the closed form
// w_i = (N P(i))^-beta / max_j (N P(j))^-beta on a small hand-made case.
func TestPrioritized_Weights(t *testing.T) {
	slots := []int{3, 5, 8, 13}
	prio := []float64{1, 2, 3, 4}
	for _, tc := range []struct {
		alpha, beta, eps float64
	}{
		{0.6, 0.4, 0.1},
		{1, 1, 0},
		{0.6, 0, 0.1}, // beta 0: all weights 1
		{0, 0.7, 0.1}, // alpha 0: uniform, all weights 1
		{2, 0.5, 1e-3},
	} {
		s := mustPrioritized(16, tc.alpha, tc.beta, tc.eps)
		var sum float64
		for i, slot := range slots {
			s.Insert(slot, 0, prio[i])
			sum += q(prio[i], tc.alpha, tc.eps)
		}
		n := float64(len(slots))
		want := map[int]float64{}
		maxW := 0.0
		for i, slot := range slots {
			want[slot] = math.Pow(n*q(prio[i], tc.alpha, tc.eps)/sum, -tc.beta)
			maxW = max(maxW, want[slot])
		}
		for slot := range want {
			want[slot] /= maxW
		}
		got, weights, err := s.Select(newRand(5), 2000, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for i, slot := range got {
			seen[slot] = true
			if w := weights[i]; math.Abs(w-want[slot]) > 1e-12*want[slot] {
				t.Errorf("%+v: slot %d weight %.15g, want %.15g", tc, slot, w, want[slot])
			}
		}
		if len(seen) != len(slots) {
			t.Fatalf("%+v: 2000 draws saw only slots %v", tc, seen)
		}
		// The least likely slot, 3, has weight exactly 1; none has more.
		if i := slices.Index(got, 3); weights[i] != 1 || slices.Max(weights) != 1 {
			t.Errorf("%+v: weight of the least likely slot %g, max weight %g; want both 1", tc, weights[i], slices.Max(weights))
		}
	}
}

// TestPrioritized_ZeroWeightSlot checks that a slot of q = 0 neither is
// picked nor sets the normalisation (which would make every weight 0).
func TestPrioritized_ZeroWeightSlot(t *testing.T) {
	s := mustPrioritized(8, 1, 1, 0)
	s.Insert(0, 0, 0)
	s.Insert(1, 0, 2)
	s.Insert(2, 0, 4)
	got, weights, err := s.Select(newRand(1), 1000, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, slot := range got {
		want := map[int]float64{1: 1, 2: 0.5}[slot]
		if slot == 0 || weights[i] != want {
			t.Fatalf("slot %d weight %g; want slots 1 and 2 with weights 1 and 0.5", slot, weights[i])
		}
	}
}

func TestPrioritized_Clamps(t *testing.T) {
	for _, p := range []float64{-1, math.Inf(1), math.Inf(-1), math.NaN(), math.Copysign(0, -1)} {
		s := mustPrioritized(4, 0.5, 0.5, 0)
		s.Insert(1, 0, p)
		s.Insert(2, 0, 1)
		s.Update(2, p)
		for slot := 1; slot <= 2; slot++ {
			if got := s.Priority(slot); got != 0 || math.Signbit(got) {
				t.Errorf("priority %g stored as %g, want 0", p, got)
			}
		}
		if s.CanSelect(1) {
			t.Errorf("priority %g made a slot pickable", p)
		}
	}
	// A huge priority must not overflow the tree's sums.
	s := mustPrioritized(5, 2, 1, 0)
	for slot := range 5 {
		s.Insert(slot, 0, math.MaxFloat64)
	}
	got, weights, err := s.Select(newRand(1), 100, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if weights[i] != 1 {
			t.Fatalf("equal huge priorities gave weight %g, want 1", weights[i])
		}
	}
}

func TestPrioritized_BadParams(t *testing.T) {
	for _, tc := range []struct {
		capacity         int
		alpha, beta, eps float64
	}{
		{0, 1, 1, 1},
		{-1, 1, 1, 1},
		{4, -1, 1, 1},
		{4, 1, -0.5, 1},
		{4, 1, 1, -1e-9},
		{4, math.NaN(), 1, 1},
		{4, 1, math.NaN(), 1},
		{4, 1, 1, math.NaN()},
		{4, math.Inf(1), 1, 1},
	} {
		if s, err := Prioritized(tc.capacity, tc.alpha, tc.beta, tc.eps); err == nil || s != nil {
			t.Errorf("Prioritized%+v = %v, %v; want an error", tc, s, err)
		}
	}
}
