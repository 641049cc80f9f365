package selector

import (
	"encoding/json"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"
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
		{Spec{Kind: "stack"}, 10, false},
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
	for name, f := range map[Kind]func(int) Selector{
		KindUniform: Uniform, KindWithoutReplacement: WithoutReplacement, KindFIFO: FIFO,
	} {
		t.Run(string(name), func(t *testing.T) {
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

func TestSpec_StringParse(t *testing.T) {
	for _, tc := range []struct {
		text string // ParseSpec's input
		spec Spec
		out  string // String of the spec
	}{
		{"uniform", Spec{Kind: KindUniform}, "uniform"},
		{"without_replacement", Spec{Kind: KindWithoutReplacement}, "without_replacement"},
		{"fifo()", Spec{Kind: KindFIFO}, "fifo"},
		{"prioritized", Spec{Kind: KindPrioritized, Alpha: 0.6, Beta: 0.4, Eps: 1e-8}, "prioritized(alpha=0.6, beta=0.4)"},
		{"prioritized(alpha=0.6, beta=0.4)", Spec{Kind: KindPrioritized, Alpha: 0.6, Beta: 0.4, Eps: 1e-8}, "prioritized(alpha=0.6, beta=0.4)"},
		{"prioritized(beta=1,alpha=0.7)", Spec{Kind: KindPrioritized, Alpha: 0.7, Beta: 1, Eps: 1e-8}, "prioritized(alpha=0.7, beta=1)"},
		{" prioritized ( eps = 0 ) ", Spec{Kind: KindPrioritized, Alpha: 0.6, Beta: 0.4}, "prioritized(alpha=0.6, beta=0.4, eps=0)"},
	} {
		spec, err := ParseSpec(tc.text)
		if err != nil || spec != tc.spec {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tc.text, spec, err, tc.spec)
			continue
		}
		if got := spec.String(); got != tc.out {
			t.Errorf("String of %+v = %q, want %q", spec, got, tc.out)
		}
		if back, err := ParseSpec(spec.String()); err != nil || back != spec {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v back", spec.String(), back, err, spec)
		}
	}
}

func TestParseSpec_Refusals(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"", `unknown kind ""`},
		{"stack", `unknown kind "stack"; one of uniform, without_replacement, prioritized, fifo, lifo, max_heap, min_heap`},
		{"Uniform", "unknown kind"},
		{"uniform(alpha=1)", "uniform takes no parameters (alpha given)"},
		{"prioritized(gamma=1)", "prioritized takes no gamma; its parameters are alpha, beta, eps"},
		{"prioritized(alpha=1, alpha=2)", "alpha given twice"},
		{"prioritized(alpha=-1)", "alpha=-1: want a finite number >= 0"},
		{"prioritized(beta=NaN)", "beta=NaN"},
		{"prioritized(beta=+Inf)", "beta=+Inf"},
		{"prioritized(alpha=x)", "alpha"},
		{"prioritized(alpha)", "not name=value"},
		{"prioritized(alpha=1", "no closing parenthesis"},
		{"prioritized(alpha=1,)", "not name=value"},
	} {
		spec, err := ParseSpec(tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSpec(%q) = %+v, %v; want an error saying %q", tc.text, spec, err, tc.want)
		}
	}
}

// TestKinds_Table: every kind in Kinds builds a selector from its defaults,
// takes the parameters Params names and refuses others, and reports
// whether it consumes what it samples.
func TestKinds_Table(t *testing.T) {
	if got := Kinds(); !slices.Equal(got, []Kind{KindUniform, KindWithoutReplacement, KindPrioritized, KindFIFO, KindLIFO, KindMaxHeap, KindMinHeap}) {
		t.Errorf("Kinds() = %v", got)
	}
	for _, k := range Kinds() {
		spec, err := Defaults(k)
		if err != nil {
			t.Fatal(err)
		}
		if s, err := New(spec, 4); err != nil || s.Spec().Kind != k {
			t.Errorf("New(Defaults(%s)) = %v, %v", k, s, err)
		}
		if got := slices.Sorted(maps.Keys(spec.Params())); !slices.Equal(got, slices.Sorted(slices.Values(k.Params()))) {
			t.Errorf("%s: Params() of its spec %v; Kind.Params %v", k, got, k.Params())
		}
		for _, name := range allParams {
			_, err := spec.With(name, 1)
			if takes := slices.Contains(k.Params(), name); takes != (err == nil) {
				t.Errorf("%s.With(%s, 1): %v; the kind takes it: %v", k, name, err, takes)
			}
		}
		if k.Consumes() != (k == KindFIFO) {
			t.Errorf("%s.Consumes() = %v", k, k.Consumes())
		}
		if s, _ := New(spec, 64); k.Repeats() != selectsTwiceTheSame(s) {
			t.Errorf("%s.Repeats() = %v; two Selects of 8 in a row returned the same slots: %v", k, k.Repeats(), !k.Repeats())
		}
	}
	if _, err := Defaults("stack"); err == nil {
		t.Error("Defaults(stack) succeeded")
	}
	if _, err := (Spec{Kind: "stack"}).With("alpha", 1); err == nil {
		t.Error("With on an unknown kind succeeded")
	}
}

// selectsTwiceTheSame fills s, a selector of 64 slots, and reports whether
// two Selects of 8 in a row return the same slots (by chance, for a random
// one, about never: the rng is seeded).
func selectsTwiceTheSame(s Selector) bool {
	for slot := range 64 {
		s.Insert(slot, uint64(slot), float64(slot))
	}
	rng := newRand(3)
	a, _, _ := s.Select(rng, 8, nil, nil)
	b, _, _ := s.Select(rng, 8, nil, nil)
	return slices.Equal(a, b)
}
