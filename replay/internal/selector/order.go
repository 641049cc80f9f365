package selector

import (
	"math/rand/v2"
	"slices"
)

// ordered returns the first slots of a fixed order: the oldest (FIFO,
// which removes them), the newest (LIFO), the largest priority (MaxHeap)
// or the smallest (MinHeap), the last three leaving them in. It keeps a
// binary heap of the present slots under that order, ties broken by seq
// (the older first for FIFO, the newer for the others) then the smaller
// slot, and each slot's place in it, so that Insert, Remove and Update are
// O(log n). A Select of n pops n items (and pushes them back unless FIFO):
// O(n log Len()).
type ordered struct {
	kind   Kind
	heap   []orderItem
	pos    []int       // pos[slot] is 1 + slot's index in heap; 0 if absent
	popped []orderItem // Select's, reused
}

type orderItem struct {
	seq  uint64
	prio float64
	slot int
}

// LIFO returns an empty selector for capacity slots whose Select(n)
// returns the n newest slots, by seq (ties by the smaller slot), newest
// first, and leaves them in (Reverb's Lifo selector; a buffer's
// MaxTimesSampled makes them leave). CanSelect(n) is 0 <= n <= Len(): the
// n returned are distinct. Every weight is 1; priority is ignored; rng is
// not used. It panics if capacity <= 0.
func LIFO(capacity int) Selector { return newOrdered(KindLIFO, capacity) }

// MaxHeap is LIFO ordered by the largest raw priority instead (ties: the
// newest), Reverb's MaxHeap selector.
func MaxHeap(capacity int) Selector { return newOrdered(KindMaxHeap, capacity) }

// MinHeap is LIFO ordered by the smallest raw priority instead (ties: the
// newest), Reverb's MinHeap selector.
func MinHeap(capacity int) Selector { return newOrdered(KindMinHeap, capacity) }

func newOrdered(kind Kind, capacity int) *ordered {
	mustCapacity(capacity)
	return &ordered{kind: kind, heap: make([]orderItem, 0, min(capacity, 1<<16)), pos: make([]int, capacity)}
}

// less reports whether a comes before b in the selector's order.
func (o *ordered) less(a, b orderItem) bool {
	switch o.kind {
	case KindFIFO:
		return a.seq < b.seq || a.seq == b.seq && a.slot < b.slot
	case KindMaxHeap:
		if a.prio != b.prio {
			return a.prio > b.prio
		}
	case KindMinHeap:
		if a.prio != b.prio {
			return a.prio < b.prio
		}
	}
	return a.seq > b.seq || a.seq == b.seq && a.slot < b.slot
}

func (o *ordered) Insert(slot int, seq uint64, priority float64) {
	checkSlot(slot, len(o.pos))
	if i := o.pos[slot] - 1; i >= 0 {
		o.heap[i].seq, o.heap[i].prio = seq, priority
		o.fix(i)
		return
	}
	o.heap = append(o.heap, orderItem{seq: seq, prio: priority, slot: slot})
	o.pos[slot] = len(o.heap)
	o.up(len(o.heap) - 1)
}

func (o *ordered) Remove(slot int) {
	if o.has(slot) {
		o.removeAt(o.pos[slot] - 1)
	}
}

func (o *ordered) Len() int { return len(o.heap) }

// CanSelect is true when 0 <= n <= Len().
func (o *ordered) CanSelect(n int) bool { return n >= 0 && n <= len(o.heap) }

func (o *ordered) Select(_ *rand.Rand, n int, slots []int, weights []float64) ([]int, []float64, error) {
	if !o.CanSelect(n) {
		return slots, weights, short(n, o.Len())
	}
	slots, weights = slices.Grow(slots, n), slices.Grow(weights, n)
	keep := !o.kind.Consumes() // FIFO returns each slot once; the others put theirs back
	o.popped = o.popped[:0]
	for range n {
		if keep {
			o.popped = append(o.popped, o.heap[0])
		}
		slots = append(slots, o.heap[0].slot)
		weights = append(weights, 1)
		o.removeAt(0)
	}
	for _, it := range o.popped {
		o.Insert(it.slot, it.seq, it.prio)
	}
	return slots, weights, nil
}

func (o *ordered) Update(slot int, priority float64) {
	if o.has(slot) {
		i := o.pos[slot] - 1
		o.heap[i].prio = priority
		o.fix(i)
	}
}

// Priority returns slot's raw priority for the heaps, presence for FIFO
// and LIFO.
func (o *ordered) Priority(slot int) float64 {
	if !o.has(slot) {
		return 0
	}
	if o.kind == KindFIFO || o.kind == KindLIFO {
		return 1
	}
	return o.heap[o.pos[slot]-1].prio
}

// Mass is 1 for a present slot: every one comes first in its turn.
func (o *ordered) Mass(slot int) float64 { return presence(o.has(slot)) }

func (o *ordered) has(slot int) bool { return slot >= 0 && slot < len(o.pos) && o.pos[slot] != 0 }

func (o *ordered) Spec() Spec { return Spec{Kind: o.kind} }

func (o *ordered) removeAt(i int) {
	last := len(o.heap) - 1
	o.pos[o.heap[i].slot] = 0
	if i != last {
		o.heap[i] = o.heap[last]
		o.pos[o.heap[i].slot] = i + 1
	}
	o.heap = o.heap[:last]
	if i != last {
		o.fix(i)
	}
}

func (o *ordered) fix(i int) {
	if !o.down(i) {
		o.up(i)
	}
}

func (o *ordered) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !o.less(o.heap[i], o.heap[parent]) {
			return
		}
		o.swap(i, parent)
		i = parent
	}
}

func (o *ordered) down(i int) bool {
	start := i
	for {
		first, l := i, 2*i+1
		if l < len(o.heap) && o.less(o.heap[l], o.heap[first]) {
			first = l
		}
		if r := l + 1; r < len(o.heap) && o.less(o.heap[r], o.heap[first]) {
			first = r
		}
		if first == i {
			return i != start
		}
		o.swap(i, first)
		i = first
	}
}

func (o *ordered) swap(i, j int) {
	o.heap[i], o.heap[j] = o.heap[j], o.heap[i]
	o.pos[o.heap[i].slot] = i + 1
	o.pos[o.heap[j].slot] = j + 1
}
