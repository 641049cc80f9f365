package selector

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestSumTree_Find(t *testing.T) {
	after3 := math.Nextafter(3, 4)
	for _, tc := range []struct {
		name   string
		leaves []float64
		u      []float64
		want   int
	}{
		{"single", []float64{0, 0, 3, 0, 0}, []float64{0, 1.5, 2.999, 3, after3, 100}, 2},
		{"first", []float64{1, 0, 0, 0, 0, 0, 0, 2}, []float64{0, 0.5, math.Nextafter(1, 0)}, 0},
		{"last", []float64{1, 0, 0, 0, 0, 0, 0, 2}, []float64{1, 2, 2.999, 3, 1e300}, 7},
		{"capacity-1", []float64{5}, []float64{0, 4.9, 5, 6}, 0},
		// u past the total must not land on the padding leaves of a
		// capacity that is not a power of two.
		{"padding", []float64{1, 1, 1, 1, 1}, []float64{5, after3 + 2, 1e9}, 4},
		{"middle", []float64{1, 2, 3, 4}, []float64{3, 4.5, math.Nextafter(6, 0)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := newSumTree(len(tc.leaves))
			for i, v := range tc.leaves {
				tree.set(i, v)
			}
			for _, u := range tc.u {
				if got := tree.find(u); got != tc.want {
					t.Errorf("find(%v) = %d, want %d", u, got, tc.want)
				}
			}
		})
	}
}

func TestMinTree(t *testing.T) {
	tree := newMinTree(5)
	if !math.IsInf(tree.min(), 1) {
		t.Fatalf("empty min tree's min = %g, want +Inf", tree.min())
	}
	for _, tc := range []struct {
		leaf int
		v    float64
		want float64
	}{
		{2, 3, 3}, {4, 1, 1}, {0, 2, 1}, {4, math.Inf(1), 2}, {0, 5, 3}, {2, math.Inf(1), 5},
	} {
		tree.set(tc.leaf, tc.v)
		if tree.min() != tc.want {
			t.Errorf("after leaf %d = %g: min %g, want %g", tc.leaf, tc.v, tree.min(), tc.want)
		}
	}
}

// TestSumTree_Drift runs 1e5 random inserts, removes and updates with
// priorities over forty orders of magnitude, some 0 (eps = 0, so their
// leaves are 0), selecting as it goes. The root must stay within 1e-9 of the
// exact sum, the min tree exact, and no Select may return an absent slot or
// one of weight 0.
func TestSumTree_Drift(t *testing.T) {
	const capacity = 1000
	const alpha = 0.7
	s := mustPrioritized(capacity, alpha, 0.5, 0)
	p := s.(*prioritized)
	rng := newRand(13)
	var slots []int
	for step := range 100000 {
		slot := rng.IntN(capacity)
		prio := math.Exp(40 * (rng.Float64() - 0.5))
		if rng.IntN(8) == 0 {
			prio = 0
		}
		switch rng.IntN(3) {
		case 0:
			s.Insert(slot, 0, prio)
		case 1:
			s.Remove(slot)
		case 2:
			s.Update(slot, prio)
		}
		if step%100 != 0 || !s.CanSelect(1) {
			continue
		}
		var err error
		if slots, _, err = s.Select(rng, 32, slots[:0], nil); err != nil {
			t.Fatal(err)
		}
		for _, slot := range slots {
			if !p.has(slot) || p.Priority(slot) == 0 {
				t.Fatalf("step %d: Select returned slot %d: present %v, priority %g",
					step, slot, p.has(slot), p.Priority(slot))
			}
		}
	}
	var qs []float64
	minQ := math.Inf(1)
	for slot := range capacity {
		if p.has(slot) {
			v := q(p.Priority(slot), alpha, 0)
			qs = append(qs, v)
			if v > 0 {
				minQ = min(minQ, v)
			}
		}
	}
	exact := accurateSum(qs)
	if got := p.sum.total(); math.Abs(got-exact) > 1e-9*exact {
		t.Errorf("root sum %.17g, brute force %.17g: relative error %.3g", got, exact, math.Abs(got-exact)/exact)
	}
	if p.min.min() != minQ {
		t.Errorf("min tree %g, brute force %g", p.min.min(), minQ)
	}
	// The edges of the range, where rounding bites, land on present slots.
	for _, u := range []float64{0, p.sum.total(), math.Nextafter(p.sum.total(), math.Inf(1))} {
		if slot := p.sum.find(u); !p.has(slot) || p.sum.leaf(slot) == 0 {
			t.Errorf("find(%g) = slot %d: present %v, q %g", u, slot, p.has(slot), p.sum.leaf(slot))
		}
	}
	if len(qs) != s.Len() {
		t.Errorf("Len %d, %d present", s.Len(), len(qs))
	}
}

// accurateSum adds xs >= 0 smallest first with Neumaier's compensation.
func accurateSum(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	var sum, c float64
	for _, x := range xs {
		t := sum + x
		if math.Abs(sum) >= math.Abs(x) {
			c += (sum - t) + x
		} else {
			c += (x - t) + sum
		}
		sum = t
	}
	return sum + c
}

// FuzzSumTree_Find checks that find lands on a positive leaf for any u.
func FuzzSumTree_Find(f *testing.F) {
	f.Add(uint64(1), 0.5)
	f.Add(uint64(2), 1.0)
	f.Add(uint64(3), 1e300)
	f.Fuzz(func(t *testing.T, seed uint64, frac float64) {
		rng := rand.New(rand.NewPCG(seed, seed))
		capacity := 1 + rng.IntN(100)
		tree := newSumTree(capacity)
		for i := range capacity {
			if rng.IntN(3) == 0 {
				tree.set(i, math.Exp(20*(rng.Float64()-0.5)))
			}
		}
		if tree.total() == 0 || math.IsNaN(frac) || frac < 0 {
			return
		}
		if i := tree.find(frac * tree.total()); tree.leaf(i) <= 0 {
			t.Fatalf("find(%g of %g) = leaf %d, which holds %g", frac, tree.total(), i, tree.leaf(i))
		}
	})
}
