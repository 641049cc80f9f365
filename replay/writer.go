package replay

import (
	"cmp"
	"container/heap"
	"slices"
)

// slotChooser picks the slots a reservation takes: the writer's policy. It
// runs under the buffer's lock and sees the slot table, whose writing slots
// it must skip.
type slotChooser interface {
	// choose returns a slot for each of n rows, or -1 for a row the policy
	// drops; keys are the rows' ranking keys (top-k only). It fails with
	// ErrFull, choosing nothing, when too few slots are free of
	// reservations.
	choose(t *slotTable, n int, keys []float64) ([]int, error)
	// committed tells it a reserved slot now holds a transition with the
	// given key; expired, that a reserved slot is empty again. choose has
	// already forgotten the slots it returned.
	committed(slot int, key float64)
	expired(slot int)
	// deleted tells it a committed slot was emptied (Delete, Reset).
	deleted(slot int)
}

// newSlotChooser returns the slot chooser of writer w for a buffer whose
// slot table is t, as t stands (no slot in it is being written): for a new
// buffer, or one reopened once its uncommitted slots were emptied. Round
// robin resumes after the newest row; top-k takes the committed slots as
// its heap and the others as free.
func newSlotChooser(w Writer, t *slotTable) slotChooser {
	capacity := t.len()
	if !w.ranks() {
		rr := &roundRobin{capacity: capacity}
		var newest uint64
		for s := range capacity {
			if seq := t.seq(s); seq > newest {
				newest, rr.next = seq, (s+1)%capacity
			}
		}
		return rr
	}
	tk := &topK{}
	for s := capacity - 1; s >= 0; s-- {
		if state(t.word(s)) != stateCommitted {
			tk.free = append(tk.free, s) // taken from the end: slot 0 first
		}
	}
	for s := range capacity {
		if state(t.word(s)) == stateCommitted {
			tk.committed(s, t.key(s))
		}
	}
	return tk
}

// roundRobin takes slots in turn, overwriting the oldest once the buffer is
// full, and skips slots other writers hold.
type roundRobin struct{ next, capacity int }

func (w *roundRobin) choose(t *slotTable, n int, _ []float64) ([]int, error) {
	out := make([]int, 0, n)
	s := w.next
	for scanned := 0; len(out) < n && scanned < w.capacity; scanned++ {
		if state(t.word(s)) != stateWriting {
			out = append(out, s)
		}
		if s++; s == w.capacity {
			s = 0
		}
	}
	if len(out) < n {
		return nil, ErrFull
	}
	w.next = s
	return out, nil
}

func (w *roundRobin) committed(int, float64) {}
func (w *roundRobin) expired(int)            {}
func (w *roundRobin) deleted(int)            {}

// topK keeps the transitions with the largest keys: free slots first, then
// the committed slot with the smallest key, if the new key is larger.
type topK struct {
	free []int   // empty slots, not reserved; taken from the end
	heap keyHeap // committed slots by key, smallest first
}

func (w *topK) choose(_ *slotTable, n int, keys []float64) ([]int, error) {
	order := make([]int, n) // rows, largest key first
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(keys[b], keys[a]) })
	out := make([]int, n)
	for _, row := range order {
		switch {
		case len(w.free) > 0:
			out[row] = w.free[len(w.free)-1]
			w.free = w.free[:len(w.free)-1]
		case w.heap.Len() > 0 && keys[row] > w.heap.keys[0]:
			out[row] = heap.Pop(&w.heap).(keyEntry).slot
		default:
			out[row] = -1
		}
	}
	return out, nil
}

func (w *topK) committed(slot int, key float64) { heap.Push(&w.heap, keyEntry{slot, key}) }

func (w *topK) expired(slot int) { w.free = append(w.free, slot) }

// deleted takes slot out of the heap (a linear search: deleting is rare)
// and makes it free.
func (w *topK) deleted(slot int) {
	if i := slices.Index(w.heap.slots, slot); i >= 0 {
		heap.Remove(&w.heap, i)
		w.free = append(w.free, slot)
	}
}

// keyHeap is a min-heap of slots by key.
type keyHeap struct {
	slots []int
	keys  []float64
}

type keyEntry struct {
	slot int
	key  float64
}

func (h *keyHeap) Len() int           { return len(h.slots) }
func (h *keyHeap) Less(i, j int) bool { return h.keys[i] < h.keys[j] }
func (h *keyHeap) Swap(i, j int) {
	h.slots[i], h.slots[j] = h.slots[j], h.slots[i]
	h.keys[i], h.keys[j] = h.keys[j], h.keys[i]
}
func (h *keyHeap) Push(x any) {
	e := x.(keyEntry)
	h.slots, h.keys = append(h.slots, e.slot), append(h.keys, e.key)
}
func (h *keyHeap) Pop() any {
	n := len(h.slots) - 1
	e := keyEntry{h.slots[n], h.keys[n]}
	h.slots, h.keys = h.slots[:n], h.keys[:n]
	return e
}
