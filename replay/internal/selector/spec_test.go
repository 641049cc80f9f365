package selector

import (
	"encoding/json"
	"math"
	"runtime"
	"testing"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		spec     Spec
		capacity int
		ok       bool
	}{
		{Spec{Kind: KindUniform}, 1, true},
		{Spec{Kind: KindWithoutReplacement}, 10, true},
		{Spec{Kind: KindFIFO}, 10, true},
		{Spec{Kind: KindPrioritized, Alpha: 0.6, Beta: 0.4, Eps: 1e-6}, 10, true},
		{Spec{Kind: KindPrioritized}, 10, true}, // alpha 0: uniform, weights 1
		{Spec{Kind: KindPrioritized, Alpha: 1, Beta: 2}, 10, true},

		{Spec{Kind: KindUniform}, 0, false},
		{Spec{Kind: KindFIFO}, -3, false},
		{Spec{Kind: KindPrioritized, Alpha: 1}, 0, false},
		{Spec{Kind: ""}, 10, false},
		{Spec{Kind: "Uniform"}, 10, false},
		{Spec{Kind: "lifo"}, 10, false},
		{Spec{Kind: KindUniform, Alpha: 0.6}, 10, false},
		{Spec{Kind: KindFIFO, Eps: 1e-6}, 10, false},
		{Spec{Kind: KindWithoutReplacement, Beta: 1}, 10, false},
		{Spec{Kind: KindPrioritized, Alpha: -0.1}, 10, false},
		{Spec{Kind: KindPrioritized, Beta: -1}, 10, false},
		{Spec{Kind: KindPrioritized, Eps: -1}, 10, false},
		{Spec{Kind: KindPrioritized, Alpha: math.NaN()}, 10, false},
		{Spec{Kind: KindPrioritized, Beta: math.Inf(1)}, 10, false},
	} {
		s, err := New(tc.spec, tc.capacity)
		if tc.ok != (err == nil) || tc.ok != (s != nil) {
			t.Errorf("New(%+v, %d) = %v, %v; want ok = %v", tc.spec, tc.capacity, s, err, tc.ok)
			continue
		}
		if tc.ok && (s.Spec() != tc.spec || s.Len() != 0) {
			t.Errorf("New(%+v, %d): Spec %+v, Len %d", tc.spec, tc.capacity, s.Spec(), s.Len())
		}
	}
}

func TestSpec_JSON(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		json string
	}{
		{Spec{Kind: KindUniform}, `{"kind":"uniform"}`},
		{Spec{Kind: KindWithoutReplacement}, `{"kind":"without_replacement"}`},
		{Spec{Kind: KindFIFO}, `{"kind":"fifo"}`},
		{Spec{Kind: KindPrioritized, Alpha: 0.6, Beta: 0.4, Eps: 1e-6}, `{"kind":"prioritized","alpha":0.6,"beta":0.4,"eps":0.000001}`},
		{Spec{Kind: KindPrioritized, Alpha: 1}, `{"kind":"prioritized","alpha":1}`},
	} {
		b, err := json.Marshal(tc.spec)
		if err != nil || string(b) != tc.json {
			t.Errorf("Marshal(%+v) = %s, %v; want %s", tc.spec, b, err, tc.json)
		}
		var back Spec
		if err := json.Unmarshal(b, &back); err != nil || back != tc.spec {
			t.Errorf("Unmarshal(%s) = %+v, %v; want %+v", b, back, err, tc.spec)
		}
	}
}

func TestConstructors_PanicOnBadCapacity(t *testing.T) {
	for name, f := range map[string]func(int) Selector{
		KindUniform: Uniform, KindWithoutReplacement: WithoutReplacement, KindFIFO: FIFO,
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("%s(0) did not panic", name)
				}
			}()
			f(0)
		})
	}
}

// TestFootprint: Footprint is at least what New allocates for the
// selector's slices, and saturates instead of overflowing.
func TestFootprint(t *testing.T) {
	for _, spec := range []Spec{{Kind: KindUniform}, {Kind: KindWithoutReplacement}, {Kind: KindFIFO},
		{Kind: KindPrioritized, Alpha: 0.6, Beta: 0.4, Eps: 1e-8}} {
		const capacity = 1<<16 + 3
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		sel, err := New(spec, capacity)
		if err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		got := after.TotalAlloc - before.TotalAlloc
		if fp := Footprint(spec, capacity); fp < got || fp > 2*got {
			t.Errorf("%s: Footprint %d bytes; New allocated %d", spec.Kind, fp, got)
		}
		runtime.KeepAlive(sel)
		if fp := Footprint(spec, math.MaxInt); fp != math.MaxUint64 {
			t.Errorf("%s: Footprint of MaxInt slots = %d, want it saturated", spec.Kind, fp)
		}
	}
}
