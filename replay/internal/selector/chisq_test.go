package selector

import (
	"math"
	"testing"
)

// chiSquareCritical returns the value that a chi-square variable with df
// degrees of freedom exceeds with probability 0.001, by the Wilson–Hilferty
// approximation: (X/df)^(1/3) is about normal with mean 1 - 2/(9 df) and
// variance 2/(9 df). It errs on the high side, by 3% for df = 1 (11.16
// against 10.83), 0.6% for df = 10 and under 0.1% from df = 50 on.
func chiSquareCritical(df int) float64 {
	const z = 3.090232306167813 // the standard normal's upper 0.001 quantile
	k := float64(df)
	c := 1 - 2/(9*k) + z*math.Sqrt(2/(9*k))
	return k * c * c * c
}

// checkProportions checks that counts[i] follow want[i] (any nonnegative
// weights, normalised here): counts must be 0 where want is 0, and Pearson's
// chi-square statistic over the other cells must stay under the critical
// value for p = 0.001 with (cells - 1) degrees of freedom. The rng seeds are
// fixed, so a pass is a pass forever; the test says the sampler is not off
// by more than chance would explain.
func checkProportions(t *testing.T, counts []int, want []float64) {
	t.Helper()
	var total, sum float64
	for i, c := range counts {
		total += float64(c)
		sum += want[i]
	}
	var stat float64
	cells := 0
	for i, c := range counts {
		if want[i] == 0 {
			if c != 0 {
				t.Errorf("slot %d of weight 0 picked %d times", i, c)
			}
			continue
		}
		cells++
		e := total * want[i] / sum
		stat += (float64(c) - e) * (float64(c) - e) / e
	}
	if cells < 2 {
		return
	}
	if crit := chiSquareCritical(cells - 1); stat > crit {
		t.Errorf("chi-square %.1f over %d cells exceeds %.1f (p = 0.001): counts %v, want proportional to %v",
			stat, cells, crit, counts, want)
	}
}

func TestChiSquareCritical(t *testing.T) {
	// Exact upper 0.001 quantiles from tables.
	for _, tc := range []struct {
		df   int
		want float64
		tol  float64 // relative
	}{
		{1, 10.828, 0.035},
		{2, 13.816, 0.025},
		{10, 29.588, 0.007},
		{50, 86.661, 0.001},
		{100, 149.449, 0.0005},
	} {
		if got := chiSquareCritical(tc.df); got < tc.want || got > (1+tc.tol)*tc.want {
			t.Errorf("chiSquareCritical(%d) = %.3f, want %.3f to %.1f%% above", tc.df, got, tc.want, 100*tc.tol)
		}
	}
}
