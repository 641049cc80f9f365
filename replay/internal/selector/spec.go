package selector

import (
	"fmt"
	"math"
	"math/bits"
)

// The kinds of selector, as Spec.Kind spells them.
const (
	KindUniform            = "uniform"
	KindWithoutReplacement = "without_replacement"
	KindPrioritized        = "prioritized"
	KindFIFO               = "fifo"
)

// Spec is a selector's kind and parameters, JSON-encodable (checkpoints store
// it). Alpha, Beta and Eps belong to KindPrioritized; New rejects them on any
// other kind, so that a parameter never goes silently unused.
type Spec struct {
	Kind  string  `json:"kind"`            // "uniform", "without_replacement", "prioritized", "fifo"
	Alpha float64 `json:"alpha,omitempty"` // prioritized
	Beta  float64 `json:"beta,omitempty"`  // prioritized
	Eps   float64 `json:"eps,omitempty"`   // prioritized
}

// Validate reports whether spec is a known kind with good parameters: for
// prioritized, alpha, beta and eps finite and >= 0; for other kinds, all of
// them zero. It allocates nothing, unlike New.
func (spec Spec) Validate() error {
	switch spec.Kind {
	case KindPrioritized:
		for _, p := range []struct {
			name string
			v    float64
		}{{"alpha", spec.Alpha}, {"beta", spec.Beta}, {"eps", spec.Eps}} {
			if err := checkParam(p.name, p.v); err != nil {
				return err
			}
		}
		return nil
	case KindUniform, KindWithoutReplacement, KindFIFO:
		if spec.Alpha != 0 || spec.Beta != 0 || spec.Eps != 0 {
			return fmt.Errorf("selector: %q takes no alpha, beta or eps (got %g, %g, %g)",
				spec.Kind, spec.Alpha, spec.Beta, spec.Eps)
		}
		return nil
	}
	return fmt.Errorf("selector: unknown kind %q", spec.Kind)
}

// New builds an empty selector for capacity slots from spec. It errors on
// capacity <= 0 and on what Validate refuses.
func New(spec Spec, capacity int) (Selector, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("selector: capacity %d is not positive", capacity)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	switch spec.Kind {
	case KindUniform:
		return Uniform(capacity), nil
	case KindWithoutReplacement:
		return WithoutReplacement(capacity), nil
	case KindPrioritized:
		return Prioritized(capacity, spec.Alpha, spec.Beta, spec.Eps)
	}
	return FIFO(capacity), nil
}

// Footprint returns how many bytes of memory New(spec, capacity) allocates,
// or a little more: what a caller checks against the machine's memory
// before it builds a selector of a capacity it was given. It saturates at
// math.MaxUint64 rather than overflow, and is 0 for an unknown kind.
func Footprint(spec Spec, capacity int) uint64 {
	const overhead = 64 << 10 // the allocator's rounding of a few large slices
	c := uint64(max(capacity, 0))
	switch spec.Kind {
	case KindUniform:
		return addSat(overhead, mulSat(c, 16)) // denseSet: items and pos
	case KindWithoutReplacement:
		return addSat(overhead, mulSat(c, 40)) // denseSet, joined, mark, order
	case KindFIFO:
		return addSat(overhead, mulSat(c, 24)) // heap of (seq, slot), pos
	case KindPrioritized:
		// prio and present per slot; a sum tree and a min tree of 2*leaves
		// float64 each, leaves being c rounded up to a power of two.
		leaves := uint64(1)
		if c > 1 {
			if n := bits.Len64(c - 1); n < 64 {
				leaves = 1 << n
			} else {
				return math.MaxUint64
			}
		}
		return addSat(overhead, addSat(mulSat(c, 9), mulSat(leaves, 32)))
	}
	return 0
}

func mulSat(a, b uint64) uint64 {
	if hi, lo := bits.Mul64(a, b); hi == 0 {
		return lo
	}
	return math.MaxUint64
}

func addSat(a, b uint64) uint64 {
	if s, carry := bits.Add64(a, b, 0); carry == 0 {
		return s
	}
	return math.MaxUint64
}

// checkParam errors unless v, the parameter called name, is finite and >= 0.
func checkParam(name string, v float64) error {
	if !(v >= 0) || math.IsInf(v, 1) {
		return fmt.Errorf("selector: %s = %g, want a finite number >= 0", name, v)
	}
	return nil
}
