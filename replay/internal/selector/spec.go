package selector

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Kind is a selector's kind, spelled as Spec.Kind, replay.json, the wire
// and the command line write it.
type Kind string

// The kinds of selector.
const (
	KindUniform            Kind = "uniform"
	KindWithoutReplacement Kind = "without_replacement"
	KindPrioritized        Kind = "prioritized"
	KindFIFO               Kind = "fifo"
	KindLIFO               Kind = "lifo"
	KindMaxHeap            Kind = "max_heap"
	KindMinHeap            Kind = "min_heap"
)

// param is a parameter a kind takes: the value ParseSpec gives it when the
// text leaves it out, and whether String writes it at that value (a
// parameter added to a kind later is not, so that the text of the specs
// made before stays the same).
type param struct {
	name   string
	def    float64
	always bool
}

// kindInfo is what the package knows of a kind beyond its selector: the
// parameters it takes, whether a sample consumes the slots it returns, and
// whether a Select returns again the slots the one before it returned.
type kindInfo struct {
	kind     Kind
	params   []param
	consumes bool
	repeats  bool
}

// kindTable lists every kind, in the order Kinds returns them. Adding a
// selector is a row here, its parameters as Spec fields (Spec.param), and
// its cases in New and Footprint; nothing outside this package names a
// kind.
var kindTable = []kindInfo{
	{kind: KindUniform},
	{kind: KindWithoutReplacement},
	{kind: KindPrioritized, params: []param{{"alpha", 0.6, true}, {"beta", 0.4, true}, {"eps", 1e-8, false}}},
	{kind: KindFIFO, consumes: true},
	{kind: KindLIFO, repeats: true},
	{kind: KindMaxHeap, repeats: true},
	{kind: KindMinHeap, repeats: true},
}

func infoOf(k Kind) (kindInfo, bool) {
	for _, ki := range kindTable {
		if ki.kind == k {
			return ki, true
		}
	}
	return kindInfo{}, false
}

// Kinds returns every kind, in a fixed order.
func Kinds() []Kind {
	out := make([]Kind, len(kindTable))
	for i, ki := range kindTable {
		out[i] = ki.kind
	}
	return out
}

// Consumes reports whether a sample takes the slots it returns out of the
// buffer for good (FIFO): the buffer marks them so that a reopened buffer
// does not return them again.
func (k Kind) Consumes() bool {
	ki, _ := infoOf(k)
	return ki.consumes
}

// Repeats reports whether a Select returns the first slots of a fixed
// order and leaves them in (LIFO, MaxHeap, MinHeap), so that a second
// Select returns the same slots while nothing changed in between. A
// sample that replaces some of its rows (overwritten while it copied
// them) with a second Select of as many would then hold a slot twice; it
// selects all of them again instead.
func (k Kind) Repeats() bool {
	ki, _ := infoOf(k)
	return ki.repeats
}

// Params returns the names of the parameters k takes, in the order
// Spec.String writes them; none for an unknown kind.
func (k Kind) Params() []string {
	ki, _ := infoOf(k)
	out := make([]string, len(ki.params))
	for i, p := range ki.params {
		out[i] = p.name
	}
	return out
}

// Spec is a selector's kind and parameters, JSON-encodable (checkpoints store
// it). Alpha, Beta and Eps belong to KindPrioritized; New rejects them on any
// other kind, so that a parameter never goes silently unused.
type Spec struct {
	Kind  Kind    `json:"kind"`
	Alpha float64 `json:"alpha,omitempty"` // prioritized
	Beta  float64 `json:"beta,omitempty"`  // prioritized
	Eps   float64 `json:"eps,omitempty"`   // prioritized
}

// param returns the field of s that holds the parameter called name, or
// nil if no kind has such a parameter.
func (s *Spec) param(name string) *float64 {
	switch name {
	case "alpha":
		return &s.Alpha
	case "beta":
		return &s.Beta
	case "eps":
		return &s.Eps
	}
	return nil
}

// allParams are the names of every parameter of every kind: the fields
// Spec.param knows.
var allParams = []string{"alpha", "beta", "eps"}

// Validate reports whether spec is a known kind with good parameters: those
// its kind takes finite and >= 0; those of other kinds zero. It allocates
// nothing, unlike New.
func (spec Spec) Validate() error {
	ki, ok := infoOf(spec.Kind)
	if !ok {
		return fmt.Errorf("selector: unknown kind %q; one of %s", spec.Kind, kindList())
	}
	for _, name := range allParams {
		v := *spec.param(name)
		takes := false
		for _, p := range ki.params {
			takes = takes || p.name == name
		}
		if takes {
			if err := checkParam(name, v); err != nil {
				return err
			}
		} else if v != 0 {
			return fmt.Errorf("selector: %s takes no %s (got %g)", spec.Kind, name, v)
		}
	}
	return nil
}

// kindList names the kinds for an error message.
func kindList() string {
	names := make([]string, len(kindTable))
	for i, ki := range kindTable {
		names[i] = string(ki.kind)
	}
	return strings.Join(names, ", ")
}

// Defaults returns the Spec of kind k with every parameter at its default:
// what ParseSpec returns for the kind's name alone.
func Defaults(k Kind) (Spec, error) {
	ki, ok := infoOf(k)
	if !ok {
		return Spec{}, fmt.Errorf("selector: unknown kind %q; one of %s", k, kindList())
	}
	s := Spec{Kind: k}
	for _, p := range ki.params {
		*s.param(p.name) = p.def
	}
	return s, nil
}

// With returns spec with the parameter called name set to v; an error if
// spec's kind takes no such parameter or v is out of range.
func (spec Spec) With(name string, v float64) (Spec, error) {
	ki, ok := infoOf(spec.Kind)
	if !ok {
		return spec, fmt.Errorf("selector: unknown kind %q; one of %s", spec.Kind, kindList())
	}
	for _, p := range ki.params {
		if p.name == name {
			if err := checkParam(name, v); err != nil {
				return spec, err
			}
			*spec.param(name) = v
			return spec, nil
		}
	}
	if len(ki.params) == 0 {
		return spec, fmt.Errorf("selector: %s takes no parameters (%s given)", spec.Kind, name)
	}
	return spec, fmt.Errorf("selector: %s takes no %s; its parameters are %s",
		spec.Kind, name, strings.Join(spec.Kind.Params(), ", "))
}

// Params returns the parameters spec's kind takes, by name, with their
// values.
func (spec Spec) Params() map[string]float64 {
	ki, _ := infoOf(spec.Kind)
	out := make(map[string]float64, len(ki.params))
	for _, p := range ki.params {
		out[p.name] = *spec.param(p.name)
	}
	return out
}

// String writes spec as ParseSpec reads it: the kind, then its parameters
// in parentheses, "prioritized(alpha=0.6, beta=0.4)". eps is written only
// when it is not its default.
func (spec Spec) String() string {
	ki, _ := infoOf(spec.Kind)
	var b strings.Builder
	b.WriteString(string(spec.Kind))
	sep := "("
	for _, p := range ki.params {
		if v := *spec.param(p.name); p.always || v != p.def {
			fmt.Fprintf(&b, "%s%s=%g", sep, p.name, v)
			sep = ", "
		}
	}
	if sep != "(" {
		b.WriteByte(')')
	}
	return b.String()
}

// ParseSpec reads a spec as String writes it: a kind's name, alone or with
// some of its parameters in parentheses, "prioritized(alpha=0.7)";
// parameters left out take their defaults (Defaults). It refuses an
// unknown kind, a parameter the kind does not take or one given twice, and
// a value out of range.
func ParseSpec(text string) (Spec, error) {
	name, args, hasArgs := strings.Cut(text, "(")
	spec, err := Defaults(Kind(strings.TrimSpace(name)))
	if err != nil || !hasArgs {
		return spec, err
	}
	args, ok := strings.CutSuffix(strings.TrimSpace(args), ")")
	if !ok {
		return Spec{}, fmt.Errorf("selector: %q: no closing parenthesis", text)
	}
	if strings.TrimSpace(args) == "" {
		return spec, nil // "uniform()"
	}
	seen := map[string]bool{}
	for _, arg := range strings.Split(args, ",") {
		k, v, ok := strings.Cut(arg, "=")
		k = strings.TrimSpace(k)
		if !ok {
			return Spec{}, fmt.Errorf("selector: %q: %q is not name=value", text, strings.TrimSpace(arg))
		}
		if seen[k] {
			return Spec{}, fmt.Errorf("selector: %q: %s given twice", text, k)
		}
		seen[k] = true
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return Spec{}, fmt.Errorf("selector: %q: %s: %w", text, k, err)
		}
		if spec, err = spec.With(k, x); err != nil {
			return Spec{}, err
		}
	}
	return spec, nil
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
	case KindLIFO, KindMaxHeap, KindMinHeap:
		return newOrdered(spec.Kind, capacity), nil
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
	case KindFIFO, KindLIFO, KindMaxHeap, KindMinHeap:
		return addSat(overhead, mulSat(c, 32)) // heap of (seq, prio, slot), pos
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
		return fmt.Errorf("selector: %s=%g: want a finite number >= 0", name, v)
	}
	return nil
}
