// Package selector chooses which slots of a fixed-capacity replay buffer a
// sample returns, as Reverb's selectors and torchrl's samplers do:
//
//   - Uniform: with replacement, every sampleable slot equally likely.
//   - WithoutReplacement: every slot once per epoch, in a random order.
//   - Prioritized: in proportion to a priority, with importance weights
//     (prioritized experience replay, Schaul et al. 2016).
//   - FIFO: the oldest slots, which the sample consumes (Reverb's Queue).
//   - LIFO, MaxHeap, MinHeap: the newest slots, or those of the largest or
//     smallest priority, left in (Reverb's Lifo, MaxHeap, MinHeap).
//
// A slot is an int in [0, capacity) naming a row of the buffer's storage. A
// selector knows which slots are sampleable, in what order they were
// inserted and with what priority; it never sees the data. The buffer owns
// the slots: it Inserts a slot once its row is committed and Removes it
// before it overwrites or deletes the row.
//
// Nothing in this package is safe for concurrent use. The replay buffer calls
// a selector under its own mutex; any other caller must do the same.
package selector

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// Selector picks slots among the committed ones.
//
// Implementations are not safe for concurrent use. Slots passed to Insert
// must lie in [0, capacity), where capacity is the one the selector was built
// with; Insert panics otherwise, as indexing a slice out of range does,
// because such a slot is a bug in the caller. Remove, Update and Priority
// treat a slot out of range as absent.
type Selector interface {
	// Insert makes slot sampleable. seq is its insertion order (larger =
	// newer; FIFO uses it); priority is the raw priority p >= 0 (finite),
	// used only by Prioritized. Inserting a slot already present replaces
	// its seq and priority.
	Insert(slot int, seq uint64, priority float64)

	// Remove makes slot unsampleable; a no-op if absent.
	Remove(slot int)

	// Len is the number of sampleable slots.
	Len() int

	// CanSelect reports whether Select(n) would succeed now. It is false
	// for every n < 0.
	CanSelect(n int) bool

	// Select appends n chosen slots to slots and their importance weights
	// to weights (1 for all selectors but Prioritized) and returns both.
	// It fails with ErrShort (wrapped or bare) when !CanSelect(n), changing
	// nothing: not the selector, not slots or weights, not rng. It never
	// returns an absent slot. rng is the only source of randomness; FIFO
	// does not use it, so it may be nil there.
	Select(rng *rand.Rand, n int, slots []int, weights []float64) ([]int, []float64, error)

	// Update sets slot's raw priority (Prioritized; others ignore it).
	// Absent slots are ignored.
	Update(slot int, priority float64)

	// Priority returns slot's raw priority (1 for non-prioritized, 0 if
	// absent).
	Priority(slot int) float64

	// Mass returns slot's share of a draw before normalisation: Select
	// picks it only if Mass > 0 (Prioritized: in proportion to it). It is
	// q = (p + eps)^alpha as Prioritized's sum tree holds it, 1 for a
	// present slot of any other selector, and 0 for an absent one. Unlike
	// Priority, it tells a present slot that cannot be picked (priority 0
	// with eps 0) from one that can.
	Mass(slot int) float64

	// Spec describes the selector's kind and parameters (for checkpoints):
	// New(s.Spec(), capacity) builds an empty selector of the same kind.
	Spec() Spec
}

// ErrShort is returned, possibly wrapped, by Select when the selector cannot
// pick the slots asked for: too few are sampleable, or (Prioritized) all of
// them have priority weight 0, or the count asked for is negative.
var ErrShort = errors.New("selector: not enough sampleable slots")

// short is ErrShort with the count asked for and the count sampleable.
func short(n, have int) error {
	return fmt.Errorf("%w: %d asked for, %d sampleable", ErrShort, n, have)
}

// checkSlot panics unless slot is in [0, capacity): the caller's bug, which
// would otherwise surface as a bare index-out-of-range deeper down.
func checkSlot(slot, capacity int) {
	if slot < 0 || slot >= capacity {
		panic(fmt.Sprintf("selector: slot %d outside [0, %d)", slot, capacity))
	}
}

// mustCapacity panics unless capacity is positive; the constructors that
// return no error use it (New and Prioritized return an error instead).
func mustCapacity(capacity int) {
	if capacity <= 0 {
		panic(fmt.Sprintf("selector: capacity %d is not positive", capacity))
	}
}
