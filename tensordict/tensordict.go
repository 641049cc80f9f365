package tensordict

import (
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"

	"github.com/tensorwire/tensorwire/memmap"
)

// Value is what a key of a TensorDict holds: a *Tensor, a nested
// *TensorDict or a *NonTensor.
type Value interface {
	isValue()
}

func (*Tensor) isValue()     {}
func (*TensorDict) isValue() {}
func (*NonTensor) isValue()  {}

// NonTensor is a value that is not a tensor, stored as tensordict's
// NonTensorData. Data must survive encoding/json: nil, bool, numbers,
// strings, and slices and string-keyed maps of them. It applies to every
// row of its TensorDict's batch.
type NonTensor struct {
	Data any
}

// TensorDict is an ordered, nested dictionary of tensors with shared leading
// batch dimensions. The zero value is not usable; build one with New,
// LoadMemmap or the methods that return new TensorDicts.
type TensorDict struct {
	batch []int
	keys  []string
	vals  map[string]Value

	// Set only on memory-mapped TensorDicts.
	locked bool
	prefix string           // the folder, on the TensorDict loaded or written there
	mapsMu sync.Mutex       // guards maps: Close clears it while Flush or Prefault may read it
	maps   []*memmap.Tensor // mappings owned (closed by Close); only on the root
}

// mapped returns the mappings td owns: none after Close, or for a
// TensorDict that owns none.
func (td *TensorDict) mapped() []*memmap.Tensor {
	td.mapsMu.Lock()
	defer td.mapsMu.Unlock()
	return td.maps
}

// New returns an empty TensorDict with the given batch size (no dimensions
// for a TensorDict without a batch).
func New(batch ...int) (*TensorDict, error) {
	if _, err := memmap.NumElements(batch); err != nil {
		return nil, fmt.Errorf("batch size: %w", err)
	}
	return newDict(batch), nil
}

func newDict(batch []int) *TensorDict {
	return &TensorDict{batch: slices.Clone(batch), vals: map[string]Value{}}
}

// BatchSize returns a copy of the batch size.
func (td *TensorDict) BatchSize() []int { return slices.Clone(td.batch) }

// Len returns the first batch dimension, or 0 without batch dimensions.
func (td *TensorDict) Len() int {
	if len(td.batch) == 0 {
		return 0
	}
	return td.batch[0]
}

// Keys returns the top-level keys in insertion order.
func (td *TensorDict) Keys() []string { return slices.Clone(td.keys) }

// Has reports whether td has a top-level key key (Python's "key in td"),
// without the copy Keys makes.
func (td *TensorDict) Has(key string) bool {
	_, ok := td.vals[key]
	return ok
}

// Prefix returns the folder a memory-mapped TensorDict lives in, or "".
func (td *TensorDict) Prefix() string { return td.prefix }

// Set stores v at key (one level; the key may contain any character,
// including "/"), replacing any value there and keeping the key's position.
// A tensor's shape, and a nested TensorDict's batch size, must start with
// td's batch size; a NonTensor's data must encode as JSON.
func (td *TensorDict) Set(key string, v Value) error {
	if td.locked {
		return fmt.Errorf("set %q: %w", key, ErrLocked)
	}
	if err := td.check(key, v); err != nil {
		return err
	}
	if _, ok := td.vals[key]; !ok {
		td.keys = append(td.keys, key)
	}
	td.vals[key] = v
	return nil
}

// SetPath stores v at a nested key, creating the TensorDicts on the way with
// the batch size of their parent.
func (td *TensorDict) SetPath(path []string, v Value) error {
	if len(path) == 0 {
		return fmt.Errorf("%w: empty path", ErrKey)
	}
	cur := td
	for i, k := range path[:len(path)-1] {
		switch sub := cur.vals[k].(type) {
		case *TensorDict:
			cur = sub
		case nil:
			n := newDict(cur.batch)
			if err := cur.Set(k, n); err != nil {
				return err
			}
			cur = n
		default:
			return fmt.Errorf("%w: %q holds a %s, not a TensorDict", ErrKey, strings.Join(path[:i+1], "/"), kindOf(sub))
		}
	}
	return cur.Set(path[len(path)-1], v)
}

// check validates v for storing at key.
func (td *TensorDict) check(key string, v Value) error {
	switch v := v.(type) {
	case *Tensor:
		if v == nil || !hasPrefix(v.shape, td.batch) {
			return fmt.Errorf("set %q: %w: tensor %v does not start with batch size %v", key, ErrBatchSize, shapeOf(v), td.batch)
		}
	case *TensorDict:
		if v == nil || !hasPrefix(v.batch, td.batch) {
			return fmt.Errorf("set %q: %w: TensorDict of batch size %v does not start with %v", key, ErrBatchSize, batchOf(v), td.batch)
		}
		if v == td {
			return fmt.Errorf("set %q: %w: a TensorDict cannot hold itself", key, ErrKey)
		}
	case *NonTensor:
		if v == nil {
			return fmt.Errorf("set %q: %w: nil NonTensor", key, ErrKey)
		}
		if _, err := json.Marshal(v.Data); err != nil {
			return fmt.Errorf("set %q: %w: non-tensor data must encode as JSON: %w", key, ErrKey, err)
		}
	default:
		return fmt.Errorf("set %q: %w: nil value", key, ErrKey)
	}
	return nil
}

func shapeOf(t *Tensor) []int {
	if t == nil {
		return nil
	}
	return t.shape
}

func batchOf(td *TensorDict) []int {
	if td == nil {
		return nil
	}
	return td.batch
}

func hasPrefix(shape, batch []int) bool {
	return len(shape) >= len(batch) && slices.Equal(shape[:len(batch)], batch)
}

// Delete removes a top-level key. Deleting a missing key returns
// ErrNotFound.
func (td *TensorDict) Delete(key string) error {
	if td.locked {
		return fmt.Errorf("delete %q: %w", key, ErrLocked)
	}
	if _, ok := td.vals[key]; !ok {
		return fmt.Errorf("delete %q: %w", key, ErrNotFound)
	}
	delete(td.vals, key)
	td.keys = slices.DeleteFunc(td.keys, func(k string) bool { return k == key })
	return nil
}

// Get returns the value at a nested key: Get("next", "obs") is
// td["next", "obs"] in tensordict.
func (td *TensorDict) Get(path ...string) (Value, error) {
	if len(path) == 0 {
		return nil, fmt.Errorf("%w: empty path", ErrKey)
	}
	var v Value = td
	for i, k := range path {
		cur, ok := v.(*TensorDict)
		if !ok {
			return nil, fmt.Errorf("%w: %q holds a %s, not a TensorDict", ErrNotFound, strings.Join(path[:i], "/"), kindOf(v))
		}
		if v, ok = cur.vals[k]; !ok {
			return nil, fmt.Errorf("%w: %q", ErrNotFound, strings.Join(path[:i+1], "/"))
		}
	}
	return v, nil
}

// Tensor returns the tensor at a nested key.
func (td *TensorDict) Tensor(path ...string) (*Tensor, error) {
	return getAs[*Tensor](td, path)
}

// Dict returns the nested TensorDict at a nested key.
func (td *TensorDict) Dict(path ...string) (*TensorDict, error) {
	return getAs[*TensorDict](td, path)
}

// NonTensor returns the non-tensor value at a nested key.
func (td *TensorDict) NonTensor(path ...string) (*NonTensor, error) {
	return getAs[*NonTensor](td, path)
}

func getAs[V Value](td *TensorDict, path []string) (V, error) {
	var zero V
	v, err := td.Get(path...)
	if err != nil {
		return zero, err
	}
	w, ok := v.(V)
	if !ok {
		return zero, fmt.Errorf("%w: %q holds a %s, not a %s", ErrKey, strings.Join(path, "/"), kindOf(v), kindOf(zero))
	}
	return w, nil
}

func kindOf(v Value) string {
	switch v.(type) {
	case *Tensor:
		return "Tensor"
	case *TensorDict:
		return "TensorDict"
	case *NonTensor:
		return "NonTensor"
	}
	return "nothing"
}

// Items iterates over every value, depth first in key order, a nested
// TensorDict before its contents. The path slice is fresh for each item.
func (td *TensorDict) Items() iter.Seq2[[]string, Value] {
	return func(yield func([]string, Value) bool) {
		td.walk(nil, yield)
	}
}

func (td *TensorDict) walk(prefix []string, yield func([]string, Value) bool) bool {
	for _, k := range td.keys {
		p := append(slices.Clone(prefix), k)
		v := td.vals[k]
		if !yield(p, v) {
			return false
		}
		if sub, ok := v.(*TensorDict); ok && !sub.walk(p, yield) {
			return false
		}
	}
	return true
}

// Leaves iterates over the tensors, depth first in key order.
func (td *TensorDict) Leaves() iter.Seq2[[]string, *Tensor] {
	return func(yield func([]string, *Tensor) bool) {
		for p, v := range td.Items() {
			if t, ok := v.(*Tensor); ok && !yield(p, t) {
				return
			}
		}
	}
}

// NumBytes returns the total size of the tensors' data.
func (td *TensorDict) NumBytes() int {
	n := 0
	for _, t := range td.Leaves() {
		n += t.NumBytes()
	}
	return n
}

// mapVals returns a TensorDict with td's keys and the given batch size,
// whose tensors are fn's results; nested TensorDicts are rebuilt the same
// way with their batch size passed through sub, and NonTensors are shared.
// It backs Index, Slice, Gather, Apply and Clone.
func (td *TensorDict) mapVals(batch []int, sub func([]int) []int, fn func(path []string, t *Tensor) (*Tensor, error)) (*TensorDict, error) {
	return td.mapAt(nil, batch, sub, fn)
}

func (td *TensorDict) mapAt(prefix []string, batch []int, sub func([]int) []int, fn func([]string, *Tensor) (*Tensor, error)) (*TensorDict, error) {
	out := newDict(batch)
	for _, k := range td.keys {
		p := append(slices.Clone(prefix), k)
		var nv Value
		switch v := td.vals[k].(type) {
		case *Tensor:
			t, err := fn(p, v)
			if err != nil {
				return nil, err
			}
			nv = t
		case *TensorDict:
			d, err := v.mapAt(p, sub(v.batch), sub, fn)
			if err != nil {
				return nil, err
			}
			nv = d
		case *NonTensor:
			nv = v
		}
		if err := out.Set(k, nv); err != nil {
			return nil, fmt.Errorf("%s: %w", strings.Join(p, "/"), err)
		}
	}
	return out, nil
}

// InPlace marks every file td maps (a TensorDict from LoadMemmap, Create,
// or written with Memmap) as rewritten in place for its whole life, as a
// replay buffer's storage is: its writes go through the mappings, never
// with pwrite for pages not in the page cache (memmap.Tensor.InPlace says
// why). A TensorDict in memory, or a view, maps no file: it does nothing
// there. Call it before td is used by other goroutines.
func (td *TensorDict) InPlace() {
	for _, m := range td.mapped() {
		m.InPlace()
	}
}
