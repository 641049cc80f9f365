package tensordict

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tensorwire/tensorwire/internal/rowcopy"
	"github.com/tensorwire/tensorwire/memmap"
)

// checkRowsOf returns an error unless t has rows and every index is a row.
func (t *Tensor) checkRowsOf(rows []int) error {
	if len(t.shape) == 0 {
		return fmt.Errorf("%w: a scalar has no rows", memmap.ErrShape)
	}
	return memmap.CheckRows(rows, t.shape[0])
}

// Row returns row i (0 <= i < Len()) as a view of shape Shape()[1:].
func (t *Tensor) Row(i int) (*Tensor, error) {
	if err := t.checkRowsOf([]int{i}); err != nil {
		return nil, err
	}
	return t.view(i, t.shape[1:]), nil
}

// Slice returns rows [start, end) as a view, with Go's slice bounds
// (0 <= start <= end <= Len()).
func (t *Tensor) Slice(start, end int) (*Tensor, error) {
	if len(t.shape) == 0 {
		return nil, fmt.Errorf("%w: a scalar has no rows", memmap.ErrShape)
	}
	if start < 0 || end < start || end > t.shape[0] {
		return nil, fmt.Errorf("%w: slice [%d:%d] of %d rows", memmap.ErrIndex, start, end, t.shape[0])
	}
	return t.view(start, append([]int{end - start}, t.shape[1:]...)), nil
}

// view returns the tensor of the given shape starting at row r.
func (t *Tensor) view(r int, shape []int) *Tensor {
	off := r * t.RowBytes()
	n, _ := memmap.NumBytes(t.dtype, shape)
	v := &Tensor{dtype: t.dtype, shape: slices.Clone(shape), mm: t.mm, off: t.off + int64(off)}
	if t.mm == nil {
		v.heap = t.heap[off : off+n : off+n]
	}
	return v
}

// Gather returns a copy, in Go memory, of the given rows in order (rows may
// repeat). An index out of range is an error wrapping memmap.ErrIndex.
func (t *Tensor) Gather(rows []int) (*Tensor, error) {
	if err := t.checkRowsOf(rows); err != nil {
		return nil, err
	}
	out, err := Zeros(t.dtype, append([]int{len(rows)}, t.shape[1:]...)...)
	if err != nil {
		return nil, err
	}
	if err := t.gatherBytes(out.heap, rows); err != nil {
		return nil, err
	}
	return out, nil
}

// GatherInto copies the given rows of t into dst, which must have t's dtype
// and the shape [len(rows), Shape()[1:]...]: Gather without allocating, for
// a batch buffer in Go memory reused across calls. dst may also be mapped;
// then the rows pass through a temporary buffer.
func (t *Tensor) GatherInto(dst *Tensor, rows []int) error {
	if err := t.checkRowsOf(rows); err != nil {
		return err
	}
	if err := t.checkRowsLike(dst, len(rows)); err != nil {
		return err
	}
	return t.gatherInto(dst, rows)
}

// gatherInto is GatherInto without the checks: rows and dst were checked.
func (t *Tensor) gatherInto(dst *Tensor, rows []int) error {
	if dst.mm == nil {
		return t.gatherBytes(dst.heap, rows)
	}
	buf := make([]byte, dst.NumBytes())
	if err := t.gatherBytes(buf, rows); err != nil {
		return err
	}
	return dst.writeAt(buf, 0)
}

// gatherBytes copies rows (already checked) into dst.
func (t *Tensor) gatherBytes(dst []byte, rows []int) error {
	rb := t.RowBytes()
	if t.mm != nil {
		return t.mm.GatherAt(dst, t.off, rb, rows)
	}
	rowcopy.Gather(dst, t.heap, rb, rows)
	return nil
}

// Scatter writes src's rows into t's given rows, in order. src must have t's
// dtype and the shape [len(rows), Shape()[1:]...]. Nothing is written unless
// every check passes.
func (t *Tensor) Scatter(rows []int, src *Tensor) error {
	if err := t.checkRowsOf(rows); err != nil {
		return err
	}
	if err := t.checkRowsLike(src, len(rows)); err != nil {
		return err
	}
	return t.scatter(rows, src)
}

// scatter is Scatter without the checks: rows and src were checked.
func (t *Tensor) scatter(rows []int, src *Tensor) error {
	b, err := src.contiguous()
	if err != nil {
		return err
	}
	rb := t.RowBytes()
	if t.mm != nil {
		return t.mm.ScatterAt(t.off, rb, rows, b)
	}
	rowcopy.Scatter(t.heap, b, rb, rows)
	return nil
}

// SetSlice writes src's rows into t's rows [start, start+src.Len()). src
// must have t's dtype and row shape; rows that do not all fall in t are an
// error wrapping memmap.ErrIndex, and nothing is written.
func (t *Tensor) SetSlice(start int, src *Tensor) error {
	if err := t.checkRowsLike(src, src.Len()); err != nil {
		return err
	}
	if err := checkSpan(start, src.Len(), t.Len()); err != nil {
		return err
	}
	return t.view(start, src.shape).copyFrom(src)
}

// checkSpan returns an error wrapping memmap.ErrIndex unless the m rows
// from start lie in [0, n), m and n being lengths (not negative). It adds
// nothing, so a start near math.MaxInt cannot overflow into range (and
// view's start*RowBytes into an offset before the view).
func checkSpan(start, m, n int) error {
	if start < 0 || start > n-m {
		return fmt.Errorf("%w: %d rows at %d of %d", memmap.ErrIndex, m, start, n)
	}
	return nil
}

// checkRowsLike checks that src is n rows of t's dtype and row shape.
func (t *Tensor) checkRowsLike(src *Tensor, n int) error {
	if len(t.shape) == 0 {
		return fmt.Errorf("%w: a scalar has no rows", memmap.ErrShape)
	}
	if src.dtype != t.dtype {
		return fmt.Errorf("%w: %v rows written into a %v tensor", memmap.ErrDType, src.dtype, t.dtype)
	}
	want := append([]int{n}, t.shape[1:]...)
	if !slices.Equal(src.shape, want) {
		return fmt.Errorf("%w: rows of shape %v, want %v", memmap.ErrShape, src.shape, want)
	}
	return nil
}

// contiguous returns t's bytes: its own memory, or a copy of mapped data.
func (t *Tensor) contiguous() ([]byte, error) {
	if t.mm == nil {
		return t.heap, nil
	}
	b := make([]byte, t.NumBytes())
	return b, t.readAt(b, 0)
}

// Fill sets every element of the given rows to v, converted to t's dtype as
// a torch cast would (see memmap.DType.PutFloat64).
func (t *Tensor) Fill(rows []int, v float64) error {
	if err := t.checkRowsOf(rows); err != nil {
		return err
	}
	return t.fill(rows, v)
}

// fill is Fill without the check: rows were checked.
func (t *Tensor) fill(rows []int, v float64) error {
	elem := make([]byte, t.dtype.Size())
	t.dtype.PutFloat64(elem, v)
	rb := t.RowBytes()
	if t.mm != nil {
		return t.mm.FillAt(t.off, rb, rows, elem)
	}
	rowcopy.Fill(t.heap, rb, rows, elem)
	return nil
}

// firstDim returns td's first batch dimension, or an error if it has none.
func (td *TensorDict) firstDim() (int, error) {
	if len(td.batch) == 0 {
		return 0, fmt.Errorf("%w: a TensorDict without batch dimensions has no rows", ErrBatchSize)
	}
	return td.batch[0], nil
}

// checkRows returns an error unless td has rows and every index is one.
func (td *TensorDict) checkRows(rows []int) error {
	n, err := td.firstDim()
	if err != nil {
		return err
	}
	return memmap.CheckRows(rows, n)
}

// dropFirst maps a batch size to the one of its rows.
func dropFirst(b []int) []int { return b[1:] }

// Index returns row i of the first batch dimension as a view: its batch size
// is BatchSize()[1:], and every tensor is the corresponding row of td's.
func (td *TensorDict) Index(i int) (*TensorDict, error) {
	if err := td.checkRows([]int{i}); err != nil {
		return nil, err
	}
	return td.mapVals(td.batch[1:], dropFirst, func(_ []string, t *Tensor) (*Tensor, error) { return t.Row(i) })
}

// Slice returns rows [start, end) of the first batch dimension as a view.
func (td *TensorDict) Slice(start, end int) (*TensorDict, error) {
	n, err := td.firstDim()
	if err != nil {
		return nil, err
	}
	if start < 0 || end < start || end > n {
		return nil, fmt.Errorf("%w: slice [%d:%d] of %d rows", memmap.ErrIndex, start, end, n)
	}
	withLen := func(b []int) []int { return append([]int{end - start}, b[1:]...) }
	return td.mapVals(withLen(td.batch), withLen, func(_ []string, t *Tensor) (*Tensor, error) { return t.Slice(start, end) })
}

// Gather returns a copy, in Go memory, of the given rows of the first batch
// dimension, in order. Every index is checked before anything is copied.
// Each call allocates its result, and fresh heap memory costs page faults
// (a 6 MB batch: about as much again as the copy); a loop that reads batch
// after batch should reuse one with GatherInto.
func (td *TensorDict) Gather(rows []int) (*TensorDict, error) {
	if err := td.checkRows(rows); err != nil {
		return nil, err
	}
	withLen := func(b []int) []int { return append([]int{len(rows)}, b[1:]...) }
	return td.mapVals(withLen(td.batch), withLen, func(_ []string, t *Tensor) (*Tensor, error) { return t.Gather(rows) })
}

// GatherInto copies the given rows into dst, a TensorDict with td's tensors
// (same keys, dtypes and row shapes) of batch size [len(rows), ...], for
// example an earlier Gather's result: Gather without allocating. dst's other
// keys are left alone. Everything is checked before anything is copied.
func (td *TensorDict) GatherInto(dst *TensorDict, rows []int) error {
	if err := td.checkRows(rows); err != nil {
		return err
	}
	pairs, err := td.pairLeaves(dst, len(rows))
	if err != nil {
		return err
	}
	for _, p := range pairs {
		if err := p.own.gatherInto(p.other, rows); err != nil {
			return fmt.Errorf("%s: %w", p.key, err)
		}
	}
	return nil
}

// Mask returns a copy of the rows whose mask entry is true; len(mask) must
// be the first batch dimension.
func (td *TensorDict) Mask(mask []bool) (*TensorDict, error) {
	n, err := td.firstDim()
	if err != nil {
		return nil, err
	}
	if len(mask) != n {
		return nil, fmt.Errorf("%w: mask of %d for %d rows", ErrBatchSize, len(mask), n)
	}
	var rows []int
	for i, m := range mask {
		if m {
			rows = append(rows, i)
		}
	}
	return td.Gather(rows)
}

// SetRows writes src's rows into td's given rows: for every tensor of src,
// the tensor at the same key of td gets src's rows, as td[rows] = src in
// tensordict. src's batch size must be [len(rows), BatchSize()[1:]...]; its
// tensors must exist in td with the same dtype and row shape; td's other
// keys and src's non-tensors are left alone. Everything is checked before
// anything is written, so a refused call changes nothing.
func (td *TensorDict) SetRows(rows []int, src *TensorDict) error {
	if err := td.checkRows(rows); err != nil {
		return err
	}
	pairs, err := td.pairLeaves(src, len(rows))
	if err != nil {
		return err
	}
	for _, p := range pairs {
		if err := p.own.scatter(rows, p.other); err != nil {
			return fmt.Errorf("%s: %w", p.key, err)
		}
	}
	return nil
}

// SetSlice writes src's rows into td's rows [start, start+src.Len()), with
// the rules of SetRows. Filling a dataset batch by batch is a SetSlice per
// batch.
func (td *TensorDict) SetSlice(start int, src *TensorDict) error {
	n, err := td.firstDim()
	if err != nil {
		return err
	}
	m, err := src.firstDim()
	if err != nil {
		return err
	}
	if err := checkSpan(start, m, n); err != nil {
		return err
	}
	pairs, err := td.pairLeaves(src, m)
	if err != nil {
		return err
	}
	for _, p := range pairs {
		if err := p.own.view(start, p.other.shape).copyFrom(p.other); err != nil {
			return fmt.Errorf("%s: %w", p.key, err)
		}
	}
	return nil
}

// Fill sets every element of every tensor in the given rows to v.
func (td *TensorDict) Fill(rows []int, v float64) error {
	if err := td.checkRows(rows); err != nil {
		return err
	}
	for p, t := range td.Leaves() { // every tensor has td's first dimension
		if err := t.fill(rows, v); err != nil {
			return fmt.Errorf("%s: %w", keyString(p), err)
		}
	}
	return nil
}

// leafPair is a tensor of td (own) and the tensor at the same key of the
// TensorDict of rows it is paired with (other), which holds n of its rows.
type leafPair struct {
	key        string
	own, other *Tensor
}

// pairLeaves matches every tensor of other, a TensorDict of n rows of td's,
// to td's tensor at the same key, checking batch size, dtypes and shapes: all
// that copying rows between them needs.
func (td *TensorDict) pairLeaves(other *TensorDict, n int) ([]leafPair, error) {
	want := append([]int{n}, td.batch[1:]...)
	if !slices.Equal(other.batch, want) {
		return nil, fmt.Errorf("%w: rows of batch size %v, want %v", ErrBatchSize, other.batch, want)
	}
	var pairs []leafPair
	for p, o := range other.Leaves() {
		key := keyString(p)
		t, err := td.Tensor(p...)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrSchema, key, err)
		}
		if err := t.checkRowsLike(o, n); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrSchema, key, err)
		}
		pairs = append(pairs, leafPair{key, t, o})
	}
	return pairs, nil
}

// keyString joins a nested key for messages, as inspect prints it.
func keyString(path []string) string { return strings.Join(path, "/") }
