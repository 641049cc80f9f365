package selector

import "math"

// sumTree is a complete binary tree over a power-of-two number of leaves in
// which every inner node holds the sum of its two children, so a leaf update
// and a prefix-sum search are both O(log capacity). Leaves hold nonnegative,
// finite values; leaves past the capacity stay 0.
//
// An update recomputes each ancestor from its children rather than adding
// the difference, so rounding errors do not accumulate over updates: every
// node is the rounded sum of its children as they are now, whatever came
// before, and the root is within about log2(size) roundings of the exact sum.
type sumTree struct {
	size int       // number of leaves, a power of two
	node []float64 // node[1] is the root, node[size+i] leaf i; node[0] unused
}

func newSumTree(capacity int) sumTree {
	size := leaves(capacity)
	return sumTree{size: size, node: make([]float64, 2*size)}
}

// leaves returns the least power of two >= capacity.
func leaves(capacity int) int {
	size := 1
	for size < capacity {
		size *= 2
	}
	return size
}

func (t *sumTree) total() float64 { return t.node[1] }

func (t *sumTree) leaf(i int) float64 { return t.node[t.size+i] }

// set sets leaf i to v >= 0 and recomputes its ancestors.
func (t *sumTree) set(i int, v float64) {
	j := t.size + i
	t.node[j] = v
	for j > 1 {
		j /= 2
		t.node[j] = t.node[2*j] + t.node[2*j+1]
	}
}

// find returns the leaf i whose interval [sum of leaves before i, that sum
// plus leaf i) holds u, for u in [0, total()); total() must be positive.
//
// It never returns a leaf holding 0, whatever u is: if rounding (u at or
// past the total, or the subtraction on the way down) would lead into a
// subtree whose sum is 0, it takes the sibling instead, whose sum is then
// positive because their parent's is. So an out-of-range u lands on the
// nearest positive leaf.
func (t *sumTree) find(u float64) int {
	j := 1
	for j < t.size {
		l, r := t.node[2*j], t.node[2*j+1]
		if r == 0 || (u < l && l > 0) {
			j = 2 * j
		} else {
			u -= l
			j = 2*j + 1
		}
	}
	return j - t.size
}

// minTree is a complete binary tree over a power-of-two number of leaves in
// which every inner node holds the least of its two children. Leaves that
// hold nothing are +Inf.
type minTree struct {
	size int
	node []float64 // as sumTree's
}

func newMinTree(capacity int) minTree {
	size := leaves(capacity)
	t := minTree{size: size, node: make([]float64, 2*size)}
	for i := range t.node {
		t.node[i] = math.Inf(1)
	}
	return t
}

// min returns the least leaf, +Inf if all are.
func (t *minTree) min() float64 { return t.node[1] }

// set sets leaf i to v and recomputes its ancestors.
func (t *minTree) set(i int, v float64) {
	j := t.size + i
	t.node[j] = v
	for j > 1 {
		j /= 2
		t.node[j] = min(t.node[2*j], t.node[2*j+1])
	}
}
