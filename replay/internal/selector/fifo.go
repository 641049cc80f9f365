package selector

import (
	"math/rand/v2"
	"slices"
)

// fifo returns and removes the oldest slots. It keeps a binary min-heap of
// the present slots ordered by (seq, slot), and each slot's place in it, so
// that Remove of any slot is O(log n).
type fifo struct {
	heap []fifoItem
	pos  []int // pos[slot] is 1 + slot's index in heap; 0 if absent
}

type fifoItem struct {
	seq  uint64
	slot int
}

func (a fifoItem) less(b fifoItem) bool {
	return a.seq < b.seq || a.seq == b.seq && a.slot < b.slot
}

// FIFO returns an empty selector for capacity slots that returns the oldest
// slots, by seq with ties broken by the smaller slot, and removes them: each
// inserted slot is returned once (Reverb's Queue, a FIFO selector with one
// sample per item). CanSelect(n) is Len() >= n, so Select(0) succeeds on an
// empty selector. Insert, Remove and each slot of a Select are O(log Len());
// every weight is 1; priority is ignored; Select does not use its rng. It
// panics if capacity <= 0; New returns an error instead.
func FIFO(capacity int) Selector {
	mustCapacity(capacity)
	return &fifo{heap: make([]fifoItem, 0, capacity), pos: make([]int, capacity)}
}

func (f *fifo) Insert(slot int, seq uint64, _ float64) {
	checkSlot(slot, len(f.pos))
	if i := f.pos[slot] - 1; i >= 0 {
		f.heap[i].seq = seq
		f.fix(i)
		return
	}
	f.heap = append(f.heap, fifoItem{seq: seq, slot: slot})
	f.pos[slot] = len(f.heap)
	f.up(len(f.heap) - 1)
}

func (f *fifo) Remove(slot int) {
	if f.has(slot) {
		f.removeAt(f.pos[slot] - 1)
	}
}

func (f *fifo) Len() int { return len(f.heap) }

// CanSelect is true when 0 <= n <= Len().
func (f *fifo) CanSelect(n int) bool { return n >= 0 && n <= len(f.heap) }

func (f *fifo) Select(_ *rand.Rand, n int, slots []int, weights []float64) ([]int, []float64, error) {
	if !f.CanSelect(n) {
		return slots, weights, short(n, f.Len())
	}
	slots, weights = slices.Grow(slots, n), slices.Grow(weights, n)
	for range n {
		slots = append(slots, f.heap[0].slot)
		weights = append(weights, 1)
		f.removeAt(0)
	}
	return slots, weights, nil
}

func (f *fifo) Update(int, float64) {}

func (f *fifo) Priority(slot int) float64 { return presence(f.has(slot)) }

func (f *fifo) has(slot int) bool { return slot >= 0 && slot < len(f.pos) && f.pos[slot] != 0 }

func (f *fifo) Spec() Spec { return Spec{Kind: KindFIFO} }

// removeAt removes the item at heap index i, moving the last item there.
func (f *fifo) removeAt(i int) {
	last := len(f.heap) - 1
	f.pos[f.heap[i].slot] = 0
	if i != last {
		f.heap[i] = f.heap[last]
		f.pos[f.heap[i].slot] = i + 1
	}
	f.heap = f.heap[:last]
	if i != last {
		f.fix(i)
	}
}

// fix restores the heap order after the item at i changed.
func (f *fifo) fix(i int) {
	if !f.down(i) {
		f.up(i)
	}
}

func (f *fifo) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !f.heap[i].less(f.heap[parent]) {
			return
		}
		f.swap(i, parent)
		i = parent
	}
}

// down moves the item at i down to its place and reports whether it moved.
func (f *fifo) down(i int) bool {
	start := i
	for {
		least, l := i, 2*i+1
		if l < len(f.heap) && f.heap[l].less(f.heap[least]) {
			least = l
		}
		if r := l + 1; r < len(f.heap) && f.heap[r].less(f.heap[least]) {
			least = r
		}
		if least == i {
			return i != start
		}
		f.swap(i, least)
		i = least
	}
}

func (f *fifo) swap(i, j int) {
	f.heap[i], f.heap[j] = f.heap[j], f.heap[i]
	f.pos[f.heap[i].slot] = i + 1
	f.pos[f.heap[j].slot] = j + 1
}
