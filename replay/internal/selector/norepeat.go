package selector

import (
	"math/rand/v2"
	"slices"
)

// withoutReplacement returns every slot once per epoch. An epoch is a random
// permutation, order, of the slots sampleable when it begins; Select walks
// it from next. An entry of order is eligible while its slot is present and
// was inserted before the epoch began: slots removed during the epoch are
// skipped, and slots inserted during it (again, possibly) wait for the next.
//
// Within one Select call, a slot already taken for the batch is set aside
// when the walk meets it again (this happens only once a new epoch has begun
// mid-batch) and put back, at a random place, among what the epoch has left
// when the call ends. The batch therefore holds distinct slots whenever
// Len() >= n, and no slot leaves an epoch before it has been returned in it.
// If the batch is longer than Len(), the epoch eventually has nothing left
// but set-aside slots; they are put back and the batch starts a new window
// of distinct slots.
//
// Cost: an epoch start is O(Len()); each entry of order is passed over once
// plus once per time it is set aside, at most n times per call; so Select is
// O(n) amortised.
type withoutReplacement struct {
	set    denseSet
	joined []uint64 // joined[slot]: the epoch during which slot was last inserted
	mark   []uint64 // mark[slot] == stamp: slot is in the current batch window
	epoch  uint64   // the current epoch, counting from 1; 0 before the first
	stamp  uint64   // the current batch window, counting from 1
	order  []int    // the current epoch's permutation
	next   int      // order[next:] is what the epoch has left
	aside  []int    // scratch for the slots set aside during a Select
}

// WithoutReplacement returns an empty selector for capacity slots that
// returns every sampleable slot once per epoch before it returns any again,
// as torchrl's SamplerWithoutReplacement does.
//
// An epoch is a random permutation of the slots sampleable when it starts;
// a new one starts when the last runs out, mid-batch if need be. Slots
// removed during an epoch are skipped. Slots inserted during an epoch wait
// for the next one; that includes a slot inserted again while still present,
// since Insert means new data in that slot. Within one batch the slots are
// distinct whenever Len() >= n. Every weight is 1; seq and priority are
// ignored. It panics if capacity <= 0; New returns an error instead.
func WithoutReplacement(capacity int) Selector {
	mustCapacity(capacity)
	return &withoutReplacement{
		set:    newDenseSet(capacity),
		joined: make([]uint64, capacity),
		mark:   make([]uint64, capacity),
		order:  make([]int, 0, capacity),
	}
}

func (w *withoutReplacement) Insert(slot int, _ uint64, _ float64) {
	checkSlot(slot, len(w.set.pos))
	w.set.add(slot)
	w.joined[slot] = w.epoch
}

func (w *withoutReplacement) Remove(slot int) { w.set.remove(slot) }

func (w *withoutReplacement) Len() int { return w.set.len() }

// CanSelect is true when some slot is sampleable and n >= 0; a batch longer
// than Len() repeats slots, each epoch still returning each slot once.
func (w *withoutReplacement) CanSelect(n int) bool { return n >= 0 && w.set.len() > 0 }

func (w *withoutReplacement) Select(rng *rand.Rand, n int, slots []int, weights []float64) ([]int, []float64, error) {
	if !w.CanSelect(n) {
		return slots, weights, short(n, w.Len())
	}
	slots, weights = slices.Grow(slots, n), slices.Grow(weights, n)
	w.stamp++
	aside := w.aside[:0]
	for range n {
		for {
			if w.next == len(w.order) {
				if len(aside) > 0 {
					// Only slots already in this batch were left: the
					// batch is longer than Len(). Return them to the
					// epoch and open a new window of distinct slots.
					w.putBack(rng, aside)
					aside = aside[:0]
					w.stamp++
				} else {
					w.newEpoch(rng)
				}
			}
			s := w.order[w.next]
			w.next++
			if !w.set.has(s) || w.joined[s] >= w.epoch {
				continue // removed, or inserted during this epoch
			}
			if w.mark[s] == w.stamp {
				aside = append(aside, s)
				continue
			}
			w.mark[s] = w.stamp
			slots = append(slots, s)
			weights = append(weights, 1)
			break
		}
	}
	w.putBack(rng, aside)
	w.aside = aside[:0]
	return slots, weights, nil
}

// newEpoch starts an epoch: a fresh random permutation of the present slots,
// all of which are eligible in it.
func (w *withoutReplacement) newEpoch(rng *rand.Rand) {
	w.epoch++
	w.order = append(w.order[:0], w.set.items...)
	rng.Shuffle(len(w.order), func(i, j int) { w.order[i], w.order[j] = w.order[j], w.order[i] })
	w.next = 0
}

// putBack returns the set-aside slots to what the epoch has left, each at a
// uniformly random place (the inside-out Fisher–Yates step), so the rest of
// the epoch stays a uniformly random permutation. It writes into positions
// already walked past: each set-aside slot was taken from one.
func (w *withoutReplacement) putBack(rng *rand.Rand, aside []int) {
	for _, s := range aside {
		w.next--
		j := w.next + rng.IntN(len(w.order)-w.next)
		w.order[w.next], w.order[j] = w.order[j], s
	}
}

func (w *withoutReplacement) Update(int, float64) {}

func (w *withoutReplacement) Priority(slot int) float64 { return presence(w.has(slot)) }

func (w *withoutReplacement) Mass(slot int) float64 { return presence(w.has(slot)) }

func (w *withoutReplacement) has(slot int) bool { return w.set.has(slot) }

func (w *withoutReplacement) Spec() Spec { return Spec{Kind: KindWithoutReplacement} }
