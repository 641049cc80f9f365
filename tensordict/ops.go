package tensordict

import (
	"fmt"
	"slices"

	"github.com/tensorwire/tensorwire/memmap"
)

// Apply returns a new TensorDict with td's keys and batch size whose tensors
// are fn's results for td's tensors (nested ones included); non-tensors are
// shared. fn's results must keep the batch dimensions.
func (td *TensorDict) Apply(fn func(path []string, t *Tensor) (*Tensor, error)) (*TensorDict, error) {
	same := func(b []int) []int { return b }
	return td.mapVals(td.batch, same, fn)
}

// Clone returns a deep copy of td in Go memory: a memory-mapped TensorDict
// comes back as an ordinary one.
func (td *TensorDict) Clone() (*TensorDict, error) {
	return td.Apply(func(_ []string, t *Tensor) (*Tensor, error) { return t.Clone() })
}

// Equal reports whether u has td's batch size, keys in the same order, equal
// tensors (Tensor.Equal) and non-tensors that encode to the same JSON.
func (td *TensorDict) Equal(u *TensorDict) bool {
	if !slices.Equal(td.batch, u.batch) || !slices.Equal(td.keys, u.keys) {
		return false
	}
	for _, k := range td.keys {
		switch a := td.vals[k].(type) {
		case *Tensor:
			b, ok := u.vals[k].(*Tensor)
			if !ok || !a.Equal(b) {
				return false
			}
		case *TensorDict:
			b, ok := u.vals[k].(*TensorDict)
			if !ok || !a.Equal(b) {
				return false
			}
		case *NonTensor:
			b, ok := u.vals[k].(*NonTensor)
			if !ok || !jsonEqual(a.Data, b.Data) {
				return false
			}
		}
	}
	return true
}

// Stack returns a new TensorDict in Go memory whose rows are tds, in order:
// its batch size is [len(tds), batch...]. All must have the same batch size
// and the same schema, every tensor's whole shape included (ErrSchema, as
// for TensorDicts without batch dimensions, whose tensors' first
// dimensions are theirs alone); non-tensors are taken from the first.
func Stack(tds []*TensorDict) (*TensorDict, error) {
	if len(tds) == 0 {
		return nil, fmt.Errorf("%w: stack of no TensorDicts", ErrBatchSize)
	}
	for i, td := range tds[1:] {
		if !slices.Equal(td.batch, tds[0].batch) {
			return nil, fmt.Errorf("%w: stack: TensorDict %d has batch size %v, the first %v", ErrBatchSize, i+1, td.batch, tds[0].batch)
		}
	}
	grow := func(b []int) []int { return append([]int{len(tds)}, b...) }
	return concat(tds, 0, grow(tds[0].batch), grow, func(s []int) []int { return grow(s) })
}

// Cat returns a new TensorDict in Go memory holding the rows of tds one
// after the other: batch sizes must agree but for the first dimension, which
// adds up. Schemas must be the same; non-tensors are taken from the first.
func Cat(tds []*TensorDict) (*TensorDict, error) {
	if len(tds) == 0 {
		return nil, fmt.Errorf("%w: cat of no TensorDicts", ErrBatchSize)
	}
	total := 0
	for i, td := range tds {
		n, err := td.firstDim()
		if err != nil {
			return nil, fmt.Errorf("cat: TensorDict %d: %w", i, err)
		}
		if !slices.Equal(td.batch[1:], tds[0].batch[1:]) {
			return nil, fmt.Errorf("%w: cat: TensorDict %d has batch size %v, the first %v", ErrBatchSize, i, td.batch, tds[0].batch)
		}
		total += n
	}
	withTotal := func(b []int) []int { return append([]int{total}, b[1:]...) }
	return concat(tds, 1, withTotal(tds[0].batch), withTotal, withTotal)
}

// concat lays the bytes of each tensor of tds end to end, which stacks them
// (a new first dimension) or concatenates them (along the first dimension)
// depending on shapeOf, which gives the result's shape from the first's.
// Each tensor's shape must be the first's but for its leading free
// dimensions: 0 to stack, 1 (the rows, which add up) to concatenate.
func concat(tds []*TensorDict, free int, batch []int, subBatch, shapeOf func([]int) []int) (*TensorDict, error) {
	return tds[0].mapVals(batch, subBatch, func(p []string, first *Tensor) (*Tensor, error) {
		parts := make([]*Tensor, len(tds))
		for i, td := range tds {
			t, err := td.Tensor(p...)
			if err != nil {
				return nil, fmt.Errorf("%w: TensorDict %d: %w", ErrSchema, i, err)
			}
			if t.dtype != first.dtype || !slices.Equal(t.shape[free:], first.shape[free:]) {
				return nil, fmt.Errorf("%w: %s: TensorDict %d has %v %v, the first %v %v",
					ErrSchema, keyString(p), i, t.dtype, t.shape, first.dtype, first.shape)
			}
			parts[i] = t
		}
		shape := shapeOf(first.shape)
		n, err := memmap.NumBytes(first.dtype, shape)
		if err != nil {
			return nil, err
		}
		out := &Tensor{dtype: first.dtype, shape: shape, heap: make([]byte, 0, n)}
		for _, t := range parts {
			if err := t.chunks(func(_ int, b []byte) error { out.heap = append(out.heap, b...); return nil }); err != nil {
				return nil, err
			}
		}
		if len(out.heap) != n {
			return nil, fmt.Errorf("%w: %s: parts hold %d bytes, the result %v needs %d", ErrSchema, keyString(p), len(out.heap), shape, n)
		}
		return out, nil
	})
}
