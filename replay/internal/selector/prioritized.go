package selector

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// prioritized picks slot i with probability P(i) = q_i / sum_j q_j, where
// q_i = (p_i + eps)^alpha, through a sum tree over the q_i; a min tree over
// the positive q_i gives the importance-weight normalisation.
type prioritized struct {
	alpha, beta, eps float64

	prio    []float64 // prio[slot]: the raw priority p as stored (after clamping)
	present []bool
	n       int     // number of present slots
	maxQ    float64 // the largest q stored, so that the tree's sums stay finite
	sum     sumTree // q of each slot; 0 if absent
	min     minTree // q of each slot with q > 0; +Inf otherwise
}

// Prioritized returns an empty selector for capacity slots that picks with
// replacement in proportion to priority, as in prioritized experience replay
// (Schaul et al. 2016) and torchrl's PrioritizedSampler.
//
// A slot of raw priority p has q = (p + eps)^alpha and probability
// P(i) = q_i / sum_j q_j; Select samples proportionally through a sum tree
// (O(log capacity) per slot, and for Insert, Remove and Update). Its weight
// is the importance weight w_i = (N * P(i))^-beta / max_j w_j, with N = Len()
// and max_j w_j = (N * P_min)^-beta, which equals (q_min / q_i)^beta: weights
// lie in (0, 1], exactly 1 for the least likely slot. P_min is taken over
// slots of q > 0 only; a slot of q = 0 (p + eps = 0 with alpha > 0) is
// never picked and does not count there. alpha = 0 is uniform sampling,
// beta = 0 makes every weight 1.
//
// Priorities passed to Insert or Update that are negative, NaN or infinite
// are clamped to 0 (the buffer validates them before); q is capped at
// MaxFloat64 divided by the tree's leaf count, so that the tree's sums stay
// finite. Prioritized errors if capacity <= 0 or alpha, beta or eps is
// negative, NaN or infinite.
func Prioritized(capacity int, alpha, beta, eps float64) (Selector, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("selector: capacity %d is not positive", capacity)
	}
	if err := (Spec{Kind: KindPrioritized, Alpha: alpha, Beta: beta, Eps: eps}).Validate(); err != nil {
		return nil, err
	}
	sum := newSumTree(capacity)
	return &prioritized{
		alpha:   alpha,
		beta:    beta,
		eps:     eps,
		prio:    make([]float64, capacity),
		present: make([]bool, capacity),
		maxQ:    math.MaxFloat64 / float64(sum.size),
		sum:     sum,
		min:     newMinTree(capacity),
	}, nil
}

func (p *prioritized) Insert(slot int, _ uint64, priority float64) {
	checkSlot(slot, len(p.present))
	if !p.present[slot] {
		p.present[slot] = true
		p.n++
	}
	p.set(slot, priority)
}

func (p *prioritized) Remove(slot int) {
	if !p.has(slot) {
		return
	}
	p.present[slot] = false
	p.n--
	p.prio[slot] = 0
	p.sum.set(slot, 0)
	p.min.set(slot, math.Inf(1))
}

func (p *prioritized) Len() int { return p.n }

// CanSelect is true when some slot is sampleable, their q sum to more than
// 0, and n >= 0.
func (p *prioritized) CanSelect(n int) bool { return n >= 0 && p.n > 0 && p.sum.total() > 0 }

func (p *prioritized) Select(rng *rand.Rand, n int, slots []int, weights []float64) ([]int, []float64, error) {
	if !p.CanSelect(n) {
		if p.n > 0 && n >= 0 {
			return slots, weights, fmt.Errorf("%w: all %d sampleable slots have weight 0", ErrShort, p.n)
		}
		return slots, weights, short(n, p.n)
	}
	slots, weights = slices.Grow(slots, n), slices.Grow(weights, n)
	total, qMin := p.sum.total(), p.min.min()
	for range n {
		s := p.sum.find(rng.Float64() * total)
		slots = append(slots, s)
		weights = append(weights, math.Pow(qMin/p.sum.leaf(s), p.beta))
	}
	return slots, weights, nil
}

func (p *prioritized) Update(slot int, priority float64) {
	if p.has(slot) {
		p.set(slot, priority)
	}
}

func (p *prioritized) Priority(slot int) float64 {
	if !p.has(slot) {
		return 0
	}
	return p.prio[slot]
}

// Mass is slot's q as the sum tree holds it (capped; 0 if absent), so
// that Mass > 0 is exactly "Select can pick it".
func (p *prioritized) Mass(slot int) float64 {
	if !p.has(slot) {
		return 0
	}
	return p.sum.leaf(slot)
}

func (p *prioritized) Spec() Spec {
	return Spec{Kind: KindPrioritized, Alpha: p.alpha, Beta: p.beta, Eps: p.eps}
}

func (p *prioritized) has(slot int) bool {
	return slot >= 0 && slot < len(p.present) && p.present[slot]
}

// set stores the present slot's priority, clamped, and its q in both trees.
func (p *prioritized) set(slot int, priority float64) {
	if !(priority > 0) || math.IsInf(priority, 1) {
		priority = 0 // also turns -0 into +0, which Priority reports
	}
	p.prio[slot] = priority
	q := min(math.Pow(priority+p.eps, p.alpha), p.maxQ)
	p.sum.set(slot, q)
	if q > 0 {
		p.min.set(slot, q)
	} else {
		p.min.set(slot, math.Inf(1))
	}
}
