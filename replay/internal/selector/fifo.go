package selector

// FIFO returns an empty selector for capacity slots that returns the oldest
// slots, by seq with ties broken by the smaller slot, and removes them: each
// inserted slot is returned once (Reverb's Queue, a FIFO selector with one
// sample per item). CanSelect(n) is Len() >= n, so Select(0) succeeds on an
// empty selector. Insert, Remove and each slot of a Select are O(log Len());
// every weight is 1; priority is ignored; Select does not use its rng. It
// panics if capacity <= 0; New returns an error instead. It is the ordered
// heap LIFO, MaxHeap and MinHeap use (order.go), in the oldest-first order.
func FIFO(capacity int) Selector { return newOrdered(KindFIFO, capacity) }
