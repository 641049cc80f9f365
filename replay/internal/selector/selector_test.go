package selector

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// kinds builds one selector of each kind for the tests they share.
var kinds = []struct {
	name Kind
	new  func(capacity int) Selector
}{
	{KindUniform, Uniform},
	{KindWithoutReplacement, WithoutReplacement},
	{KindPrioritized, func(capacity int) Selector { return mustPrioritized(capacity, 0.6, 0.4, 0.01) }},
	{KindFIFO, FIFO},
}

func mustPrioritized(capacity int, alpha, beta, eps float64) Selector {
	s, err := Prioritized(capacity, alpha, beta, eps)
	if err != nil {
		panic(err)
	}
	return s
}

// has reports whether slot is present in s, which Priority cannot tell for
// a prioritized slot of priority 0.
func has(s Selector, slot int) bool {
	return s.(interface{ has(int) bool }).has(slot)
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5e1ec7)) }

func TestSelector_Bookkeeping(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k.name), func(t *testing.T) {
			s := k.new(10)
			steps := []struct {
				op   string // "+" insert, "-" remove
				slot int
				len  int
			}{
				{"+", 3, 1},
				{"+", 7, 2},
				{"+", 3, 2}, // again: replaces, does not add
				{"-", 5, 2}, // absent: no-op
				{"+", 0, 3},
				{"+", 9, 4},
				{"-", 3, 3},
				{"-", 3, 3},
				{"-", -1, 3}, // out of range: absent
				{"-", 10, 3},
				{"-", 9, 2},
			}
			want := map[int]bool{}
			for i, st := range steps {
				if st.op == "+" {
					s.Insert(st.slot, uint64(i), 1)
					want[st.slot] = true
				} else {
					s.Remove(st.slot)
					delete(want, st.slot)
				}
				if s.Len() != st.len {
					t.Fatalf("step %d (%s%d): Len = %d, want %d", i, st.op, st.slot, s.Len(), st.len)
				}
				for slot := -1; slot <= 10; slot++ {
					if has(s, slot) != want[slot] {
						t.Fatalf("step %d: slot %d present = %v, want %v", i, slot, has(s, slot), want[slot])
					}
				}
			}
			got, _, err := s.Select(newRand(1), 2, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, slot := range got {
				if !want[slot] {
					t.Errorf("Select returned absent slot %d", slot)
				}
			}
		})
	}
}

func TestSelector_Priority(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k.name), func(t *testing.T) {
			s := k.new(4)
			s.Insert(1, 1, 2.5)
			s.Update(2, 7) // absent: ignored
			s.Update(-1, 7)
			s.Update(4, 7)
			want1 := 1.0
			if k.name == KindPrioritized {
				want1 = 2.5
			}
			for _, tc := range []struct {
				slot int
				want float64
			}{{1, want1}, {2, 0}, {-1, 0}, {4, 0}} {
				if got := s.Priority(tc.slot); got != tc.want {
					t.Errorf("Priority(%d) = %g, want %g", tc.slot, got, tc.want)
				}
			}
			if s.Len() != 1 {
				t.Errorf("Update of absent slots changed Len to %d", s.Len())
			}
			s.Update(1, 4)
			if k.name == KindPrioritized {
				want1 = 4
			}
			if got := s.Priority(1); got != want1 {
				t.Errorf("after Update, Priority(1) = %g, want %g", got, want1)
			}
		})
	}
}

func TestSelector_SelectAppends(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k.name), func(t *testing.T) {
			s := k.new(8)
			for slot := range 8 {
				s.Insert(slot, uint64(slot), float64(slot))
			}
			slots, weights, err := s.Select(newRand(1), 3, []int{-7}, []float64{-7})
			if err != nil {
				t.Fatal(err)
			}
			if len(slots) != 4 || len(weights) != 4 || slots[0] != -7 || weights[0] != -7 {
				t.Fatalf("Select(3) onto one element gave %v, %v; want the element then 3 more", slots, weights)
			}
			for i, slot := range slots[1:] {
				if !has(s, slot) && k.name != KindFIFO {
					t.Errorf("Select returned absent slot %d", slot)
				}
				if w := weights[1+i]; !(w > 0 && w <= 1) {
					t.Errorf("weight %g outside (0, 1]", w)
				}
			}
		})
	}
}

func TestSelector_SelectZero(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k.name), func(t *testing.T) {
			s := k.new(4)
			s.Insert(2, 1, 1)
			slots, weights, err := s.Select(newRand(1), 0, nil, nil)
			if err != nil || len(slots) != 0 || len(weights) != 0 {
				t.Errorf("Select(0) = %v, %v, %v; want nothing and no error", slots, weights, err)
			}
			if s.Len() != 1 {
				t.Errorf("Select(0) changed Len to %d", s.Len())
			}
		})
	}
}

// TestSelector_Short checks that a Select that cannot succeed returns
// ErrShort, agrees with CanSelect, and changes nothing: not its slices, not
// the rng, not the selector (a twin that never saw the failed call goes on to
// select exactly what the selector selects).
func TestSelector_Short(t *testing.T) {
	type op struct {
		slot int // >= 0: insert; < 0: remove -slot-1
		prio float64
		pick int // > 0: then select that many
	}
	ins := func(slot int) op { return op{slot: slot, prio: 1} }
	for _, tc := range []struct {
		name  string
		new   func(int) Selector
		setup []op
		n     int
	}{
		{"uniform/empty", Uniform, nil, 1},
		{"uniform/empty/zero", Uniform, nil, 0},
		{"uniform/negative", Uniform, []op{ins(1)}, -1},
		{"uniform/all-removed", Uniform, []op{ins(1), ins(2), {slot: -2}, {slot: -3}}, 1},
		{"without_replacement/empty", WithoutReplacement, nil, 1},
		{"without_replacement/negative", WithoutReplacement, []op{ins(1)}, -1},
		{"without_replacement/mid-epoch", WithoutReplacement,
			[]op{ins(0), ins(1), ins(2), {slot: 3, prio: 1, pick: 2}, {slot: -1}, {slot: -2}, {slot: -3}, {slot: -4}}, 1},
		{"prioritized/empty", kinds[2].new, nil, 1},
		{"prioritized/negative", kinds[2].new, []op{ins(1)}, -1},
		{"prioritized/zero-weight", func(c int) Selector { return mustPrioritized(c, 1, 0.5, 0) },
			[]op{{slot: 1}, {slot: 2}}, 1},
		{"fifo/empty", FIFO, nil, 1},
		{"fifo/too-few", FIFO, []op{ins(1), ins(2)}, 3},
		{"fifo/negative", FIFO, []op{ins(1)}, -1},
		{"fifo/after-select", FIFO, []op{ins(1), ins(2), {slot: 3, prio: 1, pick: 2}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.new(8), tc.new(8)
			ra, rb := newRand(3), newRand(3)
			for i, o := range tc.setup {
				for _, s := range []Selector{a, b} {
					if o.slot >= 0 {
						s.Insert(o.slot, uint64(i), o.prio)
					} else {
						s.Remove(-o.slot - 1)
					}
				}
				if o.pick > 0 {
					a.Select(ra, o.pick, nil, nil)
					b.Select(rb, o.pick, nil, nil)
				}
			}
			if a.CanSelect(tc.n) {
				t.Fatalf("CanSelect(%d) = true", tc.n)
			}
			inSlots, inWeights := []int{42}, []float64{0.5}
			slots, weights, err := a.Select(ra, tc.n, inSlots, inWeights)
			if !errors.Is(err, ErrShort) {
				t.Fatalf("Select(%d) error = %v, want ErrShort", tc.n, err)
			}
			if !slices.Equal(slots, inSlots) || !slices.Equal(weights, inWeights) {
				t.Errorf("failed Select returned %v, %v; want its arguments %v, %v", slots, weights, inSlots, inWeights)
			}
			if a.Len() != b.Len() {
				t.Fatalf("failed Select changed Len from %d to %d", b.Len(), a.Len())
			}
			// Go on identically; the outputs must match.
			for slot := range 8 {
				a.Insert(slot, uint64(100+slot), float64(slot+1))
				b.Insert(slot, uint64(100+slot), float64(slot+1))
			}
			for range 4 {
				sa, wa, ea := a.Select(ra, 2, nil, nil)
				sb, wb, eb := b.Select(rb, 2, nil, nil)
				if ea != nil || eb != nil {
					t.Fatalf("Select after refill: %v, %v", ea, eb)
				}
				if !slices.Equal(sa, sb) || !slices.Equal(wa, wb) {
					t.Fatalf("after the failed Select, the selector diverged from its twin: %v %v, twin %v %v", sa, wa, sb, wb)
				}
			}
		})
	}
}

func TestSelector_InsertOutOfRangePanics(t *testing.T) {
	for _, k := range kinds {
		for _, slot := range []int{-1, 4} {
			t.Run(string(k.name), func(t *testing.T) {
				defer func() {
					if recover() == nil {
						t.Errorf("Insert(%d) into capacity 4 did not panic", slot)
					}
				}()
				k.new(4).Insert(slot, 0, 1)
			})
		}
	}
}

func TestSelector_Spec(t *testing.T) {
	for _, k := range kinds {
		t.Run(string(k.name), func(t *testing.T) {
			spec := k.new(4).Spec()
			if spec.Kind != k.name {
				t.Errorf("Spec().Kind = %q, want %q", spec.Kind, k.name)
			}
			s, err := New(spec, 4)
			if err != nil {
				t.Fatal(err)
			}
			if s.Spec() != spec {
				t.Errorf("New(%+v).Spec() = %+v", spec, s.Spec())
			}
		})
	}
}

// TestSelector_Model runs random operations on each selector and on a map
// that models it, checking after each one that they agree on what is
// present, on Len, Priority and CanSelect, and that Select returns only
// present slots (FIFO: exactly the oldest ones, which it removes).
func TestSelector_Model(t *testing.T) {
	const capacity = 48
	type item struct {
		seq  uint64
		prio float64
	}
	for _, tc := range []struct {
		name Kind
		new  func(int) Selector
		eps  float64 // prioritized: a slot is pickable iff prio+eps > 0
	}{
		{KindUniform, Uniform, 0},
		{KindWithoutReplacement, WithoutReplacement, 0},
		{KindPrioritized, kinds[2].new, 0.01},
		{KindPrioritized + "/eps0", func(c int) Selector { return mustPrioritized(c, 0.7, 1, 0) }, 0},
		{KindFIFO, FIFO, 0},
	} {
		t.Run(string(tc.name), func(t *testing.T) {
			prioritized := tc.new(1).Spec().Kind == KindPrioritized
			rng := newRand(7)
			s := tc.new(capacity)
			model := map[int]item{}
			var seq uint64
			for step := range 20000 {
				slot := rng.IntN(capacity)
				prio := float64(rng.IntN(4)) // 0 often enough to matter
				switch op := rng.IntN(10); {
				case op < 4:
					seq++
					s.Insert(slot, seq, prio)
					model[slot] = item{seq, prio}
				case op < 7:
					s.Remove(slot)
					delete(model, slot)
				case op < 8:
					s.Update(slot, prio)
					if it, ok := model[slot]; ok {
						model[slot] = item{it.seq, prio}
					}
				default:
					n := rng.IntN(6)
					canSelect := n <= len(model)
					if tc.name != KindFIFO {
						canSelect = false
						for _, it := range model {
							canSelect = canSelect || !prioritized || it.prio+tc.eps > 0
						}
					}
					if got := s.CanSelect(n); got != canSelect {
						t.Fatalf("step %d: CanSelect(%d) = %v, want %v (model %v)", step, n, got, canSelect, model)
					}
					slots, weights, err := s.Select(rng, n, nil, nil)
					if !canSelect {
						if !errors.Is(err, ErrShort) {
							t.Fatalf("step %d: Select(%d) error %v, want ErrShort", step, n, err)
						}
						break
					}
					if err != nil || len(slots) != n || len(weights) != n {
						t.Fatalf("step %d: Select(%d) = %v, %v, %v", step, n, slots, weights, err)
					}
					if tc.name == KindFIFO {
						oldest := oldestN(model, n, func(it item) uint64 { return it.seq })
						if !slices.Equal(slots, oldest) {
							t.Fatalf("step %d: FIFO Select(%d) = %v, want the oldest %v", step, n, slots, oldest)
						}
						for _, slot := range slots {
							delete(model, slot)
						}
						break
					}
					for i, slot := range slots {
						it, ok := model[slot]
						if !ok || prioritized && it.prio+tc.eps == 0 {
							t.Fatalf("step %d: Select returned slot %d, absent or of weight 0", step, slot)
						}
						if w := weights[i]; !(w > 0 && w <= 1) || !prioritized && w != 1 {
							t.Fatalf("step %d: weight %g for slot %d", step, w, slot)
						}
					}
				}
				if s.Len() != len(model) {
					t.Fatalf("step %d: Len = %d, model has %d", step, s.Len(), len(model))
				}
				for slot := range capacity {
					it, ok := model[slot]
					want := 0.0
					if ok {
						want = 1
						if prioritized {
							want = it.prio
						}
					}
					if has(s, slot) != ok || s.Priority(slot) != want {
						t.Fatalf("step %d: slot %d present %v priority %g; model: %v %g",
							step, slot, has(s, slot), s.Priority(slot), ok, want)
					}
					if pickable := ok && (!prioritized || it.prio+tc.eps > 0); (s.Mass(slot) > 0) != pickable {
						t.Fatalf("step %d: slot %d Mass %g; model: present %v, pickable %v", step, slot, s.Mass(slot), ok, pickable)
					}
				}
			}
		})
	}
}

// oldestN returns the n slots of m with the least (seq, slot), in order.
func oldestN[T any](m map[int]T, n int, seq func(T) uint64) []int {
	slots := make([]int, 0, len(m))
	for slot := range m {
		slots = append(slots, slot)
	}
	slices.SortFunc(slots, func(a, b int) int {
		return cmp.Or(cmp.Compare(seq(m[a]), seq(m[b])), cmp.Compare(a, b))
	})
	return slots[:n]
}
