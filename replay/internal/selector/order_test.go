package selector

import (
	"slices"
	"testing"
)

func TestOrdered_FirstSlotsStayIn(t *testing.T) {
	type ins struct {
		slot int
		seq  uint64
		prio float64
	}
	inserts := []ins{{5, 10, 2}, {2, 30, 0.5}, {9, 20, 7}, {0, 40, 1}, {4, 15, 7}}
	for _, tc := range []struct {
		kind    Kind
		removes []int
		updates map[int]float64
		n       int
		want    []int
	}{
		{kind: KindLIFO, n: 3, want: []int{0, 2, 9}},
		{kind: KindLIFO, removes: []int{2}, n: 2, want: []int{0, 9}},
		{kind: KindMaxHeap, n: 3, want: []int{9, 4, 5}}, // 7 (seq 20), 7 (seq 15), 2
		{kind: KindMaxHeap, updates: map[int]float64{2: 9}, n: 2, want: []int{2, 9}},
		{kind: KindMinHeap, n: 2, want: []int{2, 0}},
		{kind: KindMinHeap, removes: []int{2}, updates: map[int]float64{5: 0}, n: 5 - 1, want: []int{5, 0, 9, 4}},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			s, err := New(Spec{Kind: tc.kind}, 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range inserts {
				s.Insert(in.slot, in.seq, in.prio)
			}
			for _, slot := range tc.removes {
				s.Remove(slot)
			}
			for slot, p := range tc.updates {
				s.Update(slot, p)
			}
			left := s.Len()
			for range 2 { // the slots stay in: the same answer twice
				got, weights, err := s.Select(nil, tc.n, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("Select(%d) = %v, want %v", tc.n, got, tc.want)
				}
				for _, w := range weights {
					if w != 1 {
						t.Errorf("weight %g, want 1", w)
					}
				}
				if s.Len() != left {
					t.Errorf("Len = %d after Select, want %d", s.Len(), left)
				}
			}
			if s.CanSelect(left+1) || !s.CanSelect(left) {
				t.Errorf("CanSelect around Len %d wrong", left)
			}
			if _, _, err := s.Select(nil, left+1, nil, nil); err == nil {
				t.Errorf("Select(%d) of %d: no error", left+1, left)
			}
			if s.Spec().Kind != tc.kind {
				t.Errorf("Spec %v", s.Spec())
			}
		})
	}
}

func TestOrdered_ParseAndPriority(t *testing.T) {
	for _, k := range []Kind{KindLIFO, KindMaxHeap, KindMinHeap} {
		spec, err := ParseSpec(string(k))
		if err != nil || spec.Kind != k || spec.String() != string(k) {
			t.Errorf("ParseSpec(%q) = %v, %v", k, spec, err)
		}
		if _, err := ParseSpec(string(k) + "(alpha=1)"); err == nil {
			t.Errorf("%s took alpha", k)
		}
		s, _ := New(spec, 4)
		s.Insert(1, 1, 3)
		want := 3.0
		if k == KindLIFO {
			want = 1
		}
		if got := s.Priority(1); got != want {
			t.Errorf("%s: Priority = %g, want %g", k, got, want)
		}
		if s.Priority(2) != 0 || s.Priority(-1) != 0 {
			t.Errorf("%s: absent slot has a priority", k)
		}
	}
}
