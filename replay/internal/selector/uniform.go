package selector

import (
	"math/rand/v2"
	"slices"
)

// uniform picks with replacement, every sampleable slot equally likely.
type uniform struct {
	set denseSet
}

// Uniform returns an empty selector for capacity slots that picks with
// replacement, each sampleable slot equally likely (Reverb's Uniform,
// torchrl's RandomSampler). Insert and Remove are O(1), Select is O(n);
// every weight is 1. It ignores seq and priority. It panics if
// capacity <= 0; New returns an error instead.
func Uniform(capacity int) Selector {
	mustCapacity(capacity)
	return &uniform{set: newDenseSet(capacity)}
}

func (u *uniform) Insert(slot int, _ uint64, _ float64) {
	checkSlot(slot, len(u.set.pos))
	u.set.add(slot)
}

func (u *uniform) Remove(slot int) { u.set.remove(slot) }

func (u *uniform) Len() int { return u.set.len() }

// CanSelect is true when some slot is sampleable and n >= 0.
func (u *uniform) CanSelect(n int) bool { return n >= 0 && u.set.len() > 0 }

func (u *uniform) Select(rng *rand.Rand, n int, slots []int, weights []float64) ([]int, []float64, error) {
	if !u.CanSelect(n) {
		return slots, weights, short(n, u.Len())
	}
	slots, weights = slices.Grow(slots, n), slices.Grow(weights, n)
	items := u.set.items
	for range n {
		slots = append(slots, items[rng.IntN(len(items))])
		weights = append(weights, 1)
	}
	return slots, weights, nil
}

func (u *uniform) Update(int, float64) {}

func (u *uniform) Priority(slot int) float64 { return presence(u.has(slot)) }

func (u *uniform) Mass(slot int) float64 { return presence(u.has(slot)) }

func (u *uniform) has(slot int) bool { return u.set.has(slot) }

func (u *uniform) Spec() Spec { return Spec{Kind: KindUniform} }

// presence is the Priority and the Mass of a non-prioritized selector's
// slot: 1 if present, 0 if absent.
func presence(present bool) float64 {
	if present {
		return 1
	}
	return 0
}
