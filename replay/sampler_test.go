package replay

import (
	"math"
	"testing"
)

// TestSamplers_Distributions samples a buffer through its public calls and
// checks how often each transition comes back: uniformly, and for
// prioritized sampling in proportion to p^alpha, with the importance
// weights (N P(i))^-beta / max. Counts are compared with their expected
// values within 5 standard deviations (binomial), which a correct sampler
// misses about once in 1.7 million.
func TestSamplers_Distributions(t *testing.T) {
	const draws = 60000
	prio := []float64{1, 2, 3, 4, 10}
	for _, tc := range []struct {
		name    string
		sampler Sampler
		alpha   float64 // 0: uniform
		beta    float64
	}{
		{"uniform", Uniform(), 0, 0},
		{"prioritized alpha 1", Prioritized(1, 1), 1, 1},
		{"prioritized alpha 0.6", Prioritized(0.6, 0.4), 0.6, 0.4},
		{"prioritized alpha 0", Prioritized(0, 0.5), 0, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := create(t, Config{Capacity: len(prio), Sampler: tc.sampler})
			if _, err := b.ExtendPriority(ctxT(t), transitions(t, 0, 1, 2, 3, 4), prio); err != nil {
				t.Fatal(err)
			}
			q := make([]float64, len(prio))
			sum, qmin := 0.0, math.Inf(1)
			for i, p := range prio {
				q[i] = math.Pow(p+1e-8, tc.alpha) // Prioritized's eps
				sum += q[i]
				qmin = min(qmin, q[i])
			}
			counts := make([]int, len(prio))
			for range draws / 1000 {
				td, info, err := b.Sample(ctxT(t), 1000)
				if err != nil {
					t.Fatal(err)
				}
				for i, id := range rowIDs(t, td) {
					counts[id]++
					want := 1.0
					if tc.sampler.Kind() == "prioritized" {
						n := float64(len(prio))
						want = math.Pow(n*q[id]/sum, -tc.beta) / math.Pow(n*qmin/sum, -tc.beta)
					}
					if math.Abs(info.Weights[i]-want) > 1e-9 {
						t.Fatalf("transition %d has weight %v, want %v", id, info.Weights[i], want)
					}
				}
			}
			for id, c := range counts {
				p := q[id] / sum
				mean, sd := draws*p, math.Sqrt(draws*p*(1-p))
				if math.Abs(float64(c)-mean) > 5*sd {
					t.Errorf("transition %d (priority %v) drawn %d times, expected %.0f ± %.0f", id, prio[id], c, mean, sd)
				}
			}
			t.Logf("counts %v", counts)
		})
	}
}
