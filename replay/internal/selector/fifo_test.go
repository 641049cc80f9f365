package selector

import (
	"errors"
	"slices"
	"testing"
)

func TestFIFO_OldestFirst(t *testing.T) {
	type ins struct {
		slot int
		seq  uint64
	}
	for _, tc := range []struct {
		name    string
		inserts []ins
		removes []int
		batches []int
		want    [][]int
	}{
		{
			name:    "by seq, not slot",
			inserts: []ins{{5, 10}, {2, 30}, {9, 20}, {0, 40}},
			batches: []int{1, 2, 1},
			want:    [][]int{{5}, {9, 2}, {0}},
		},
		{
			name:    "ties by slot",
			inserts: []ins{{7, 1}, {3, 1}, {4, 0}, {1, 1}},
			batches: []int{4},
			want:    [][]int{{4, 1, 3, 7}},
		},
		{
			name:    "remove middle and oldest",
			inserts: []ins{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}},
			removes: []int{2, 0, 8},
			batches: []int{2, 2},
			want:    [][]int{{1, 3}, {4, 5}},
		},
		{
			name:    "insert again replaces seq",
			inserts: []ins{{0, 1}, {1, 2}, {2, 3}, {0, 9}, {2, 0}},
			batches: []int{3},
			want:    [][]int{{2, 1, 0}},
		},
		{
			name:    "zero",
			inserts: []ins{{3, 1}},
			batches: []int{0, 1, 0},
			want:    [][]int{{}, {3}, {}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := FIFO(10)
			for _, in := range tc.inserts {
				s.Insert(in.slot, in.seq, 0)
			}
			for _, slot := range tc.removes {
				s.Remove(slot)
			}
			left := s.Len()
			for i, n := range tc.batches {
				got, weights, err := s.Select(nil, n, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tc.want[i]) {
					t.Errorf("batch %d: Select(%d) = %v, want %v", i, n, got, tc.want[i])
				}
				for _, w := range weights {
					if w != 1 {
						t.Errorf("weight %g, want 1", w)
					}
				}
				left -= n
				if s.Len() != left {
					t.Errorf("after batch %d: Len = %d, want %d", i, s.Len(), left)
				}
				for _, slot := range got {
					if has(s, slot) {
						t.Errorf("slot %d still present after Select returned it", slot)
					}
				}
			}
		})
	}
}

func TestFIFO_Short(t *testing.T) {
	s := FIFO(4)
	s.Insert(1, 1, 0)
	s.Insert(2, 2, 0)
	if _, _, err := s.Select(nil, 3, nil, nil); !errors.Is(err, ErrShort) {
		t.Fatalf("Select(3) of 2: %v, want ErrShort", err)
	}
	if got, _, err := s.Select(nil, 2, nil, nil); err != nil || !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("after the failed Select, Select(2) = %v, %v; want [1 2]", got, err)
	}
	if got, _, err := s.Select(nil, 0, nil, nil); err != nil || len(got) != 0 {
		t.Fatalf("Select(0) of none = %v, %v; want nothing, no error", got, err)
	}
}

// TestFIFO_Heap checks the heap against a sort after random inserts and
// removes, through every slot coming out in order.
func TestFIFO_Heap(t *testing.T) {
	const capacity = 300
	rng := newRand(2)
	s := FIFO(capacity)
	model := map[int]uint64{}
	for range 5000 {
		slot := rng.IntN(capacity)
		if rng.IntN(3) == 0 {
			s.Remove(slot)
			delete(model, slot)
		} else {
			seq := uint64(rng.IntN(50)) // many ties
			s.Insert(slot, seq, 0)
			model[slot] = seq
		}
	}
	want := oldestN(model, len(model), func(seq uint64) uint64 { return seq })
	got, _, err := s.Select(nil, len(model), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || s.Len() != 0 {
		t.Errorf("drained %v (Len now %d), want %v", got, s.Len(), want)
	}
}
