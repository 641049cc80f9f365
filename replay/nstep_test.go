package replay

import (
	"errors"
	"math"
	"testing"
)

// TestNStep_AgainstPlainComputation: n-step returns over sampled slices
// equal a plain computation over the stored episodes, cut at each
// episode's end and at each slice's.
func TestNStep_AgainstPlainComputation(t *testing.T) {
	b := create(t, Config{Capacity: 200, Schema: stepSchema, TrajKey: []string{"episode"}})
	ctx := ctxT(t)
	lens := map[int64]int{1: 9, 2: 25, 3: 4, 4: 13}
	reward := func(ep, t int64) float64 { return float64((ep*31+t*7)%13) - 6 }
	for ep, l := range lens {
		if _, err := b.Extend(ctx, steps(t, ep, 0, l)); err != nil {
			t.Fatal(err)
		}
	}
	const gamma, n, L = 0.9, 3, 6
	td, info, err := b.SampleSlices(ctx, SliceSpec{SliceLen: L, NumSlices: 300, PadShort: true})
	if err != nil {
		t.Fatal(err)
	}
	eps, st, err := stepsOf(td)
	if err != nil {
		t.Fatal(err)
	}
	rows := len(eps)
	r := make([]float64, rows)
	done := make([]bool, rows)
	for i := range rows {
		if info.Mask[i] {
			r[i], done[i] = reward(eps[i], st[i]), st[i] == int64(lens[eps[i]]-1)
		}
	}
	got, err := NStep(r, done, info.Mask, gamma, n, L)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		if !info.Mask[i] {
			if got.Return[i] != 0 || got.Steps[i] != 0 || got.Discount[i] != 0 {
				t.Fatalf("padding row %d: %v %v %v", i, got.Return[i], got.Steps[i], got.Discount[i])
			}
			continue
		}
		// Plain: from the episode as written, to its end or the slice's.
		ep, s := eps[i], st[i]
		sliceEnd := st[i-i%L] + L // one past the slice's last step
		g, scale, m := 0.0, 1.0, 0
		for k := s; k < s+n && k < int64(lens[ep]) && k < sliceEnd; k++ {
			g += scale * reward(ep, k)
			scale *= gamma
			m++
		}
		disc := scale
		if s+int64(m)-1 == int64(lens[ep]-1) {
			disc = 0
		}
		if math.Abs(got.Return[i]-g) > 1e-12 || got.Steps[i] != m || math.Abs(got.Discount[i]-disc) > 1e-12 ||
			st[got.Last[i]] != s+int64(m)-1 {
			t.Fatalf("row %d (episode %d step %d): return %v steps %d discount %v last %d; want %v %d %v",
				i, ep, s, got.Return[i], got.Steps[i], got.Discount[i], got.Last[i], g, m, disc)
		}
	}
	if _, err := NStep(r, done[:1], nil, gamma, n, L); !errors.Is(err, ErrArgument) {
		t.Fatalf("mismatched lengths: %v", err)
	}
}
