package tensordict

import (
	"fmt"
	"unsafe"

	"github.com/tensorwire/tensorwire/memmap"
	"gorgonia.org/tensor"
)

// This file is the one place where tensorwire meets gorgonia: zero-copy
// *tensor.Dense views of tensors, and tensors from Dense values. memmap below
// knows nothing of gorgonia.

// denseDTypes pairs every memmap dtype with the gorgonia dtype of its Dense
// view. Float16 and BFloat16 have no gorgonia counterpart: their views are
// uint16, holding the raw bits.
var denseDTypes = []struct {
	dt    memmap.DType
	dense tensor.Dtype
}{
	{memmap.Bool, tensor.Bool},
	{memmap.Uint8, tensor.Uint8},
	{memmap.Int8, tensor.Int8},
	{memmap.Int16, tensor.Int16},
	{memmap.Int32, tensor.Int32},
	{memmap.Int64, tensor.Int64},
	{memmap.Uint16, tensor.Uint16},
	{memmap.Uint32, tensor.Uint32},
	{memmap.Uint64, tensor.Uint64},
	{memmap.Float16, tensor.Uint16},
	{memmap.BFloat16, tensor.Uint16},
	{memmap.Float32, tensor.Float32},
	{memmap.Float64, tensor.Float64},
	{memmap.Complex64, tensor.Complex64},
	{memmap.Complex128, tensor.Complex128},
}

// DenseDType returns the gorgonia dtype of a Dense view of dtype dt, or the
// zero tensor.Dtype for an invalid one. Float16 and BFloat16 map to
// tensor.Uint16: the view holds their raw bits.
func DenseDType(dt memmap.DType) tensor.Dtype {
	for _, p := range denseDTypes {
		if p.dt == dt {
			return p.dense
		}
	}
	return tensor.Dtype{}
}

// DTypeOf returns the dtype whose Dense view has gorgonia dtype dt. A
// tensor.Uint16 is memmap.Uint16: a float16 tensor cannot be told from its
// raw bits (use Tensor.WithDType). A gorgonia dtype with no torch
// counterpart is an error wrapping memmap.ErrDType.
func DTypeOf(dt tensor.Dtype) (memmap.DType, error) {
	for _, p := range denseDTypes {
		if p.dense == dt && p.dt.Bits() == p.dt {
			return p.dt, nil
		}
	}
	return memmap.Invalid, fmt.Errorf("%w: gorgonia dtype %v has no torch counterpart", memmap.ErrDType, dt)
}

// FromDense returns a Tensor over the memory of a gorgonia *tensor.Dense,
// without copying when d is contiguous in C order (a transposed view is
// copied). Use WithDType to give a uint16 Dense the dtype float16 or
// bfloat16.
func FromDense(d *tensor.Dense) (*Tensor, error) {
	b, dt, err := denseBytes(d)
	if err != nil {
		return nil, err
	}
	return FromBytes(dt, d.Shape(), b)
}

// CreateFromDense creates a file at path (as memmap.Create does: zero-filled,
// blocks reserved, renamed into place) holding a copy of d's elements in C
// order, and returns it mapped read-write. The caller owns the returned
// memmap.Tensor and must Close it.
func CreateFromDense(path string, d *tensor.Dense) (*memmap.Tensor, error) {
	src, dt, err := denseBytes(d)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	t, err := memmap.Create(path, dt, d.Shape()...)
	if err != nil {
		return nil, err
	}
	if _, err := t.WriteAt(src, 0); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Dense returns a *tensor.Dense view of t's data: no copy is made, and writes
// through it change t. Float16 and bfloat16 tensors give a uint16 view of
// their bits. A view of mapped data has the lifetime of Bytes: valid only
// until the mapping is closed. Avoid gorgonia operations that move data in
// place, such as T and Transpose, on a view of a mapping: they rewrite the
// file.
//
// For a whole memmap.Tensor mm, View(mm, 0, mm.Shape()...) gives the Tensor
// to call Dense on.
func (t *Tensor) Dense() (*tensor.Dense, error) {
	b, err := t.Bytes()
	if err != nil {
		return nil, err
	}
	return denseView(t.dtype, t.shape, b)
}

// denseView returns a *tensor.Dense of dtype dt and shape shape over data,
// which must hold exactly NumBytes(dt, shape) bytes and outlive the view.
// Zero-element tensors get a Dense with its own (empty) storage, since
// gorgonia cannot view zero bytes.
func denseView(dt memmap.DType, shape []int, data []byte) (d *tensor.Dense, err error) {
	size, err := memmap.NumBytes(dt, shape)
	if err != nil {
		return nil, err
	}
	if len(data) != size {
		return nil, fmt.Errorf("%w: %d bytes for %v %v (%d bytes)", memmap.ErrShape, len(data), dt, shape, size)
	}
	defer func() {
		// gorgonia panics on shapes it does not support; keep that inside.
		if r := recover(); r != nil {
			d, err = nil, fmt.Errorf("%w: gorgonia cannot view %v %v: %v", memmap.ErrShape, dt, shape, r)
		}
	}()
	opts := []tensor.ConsOpt{tensor.Of(DenseDType(dt))}
	if len(shape) > 0 {
		opts = append(opts, tensor.WithShape(shape...))
	}
	if size == 0 {
		return tensor.New(opts...), nil
	}
	opts = append(opts, tensor.FromMemory(uintptr(unsafe.Pointer(&data[0])), uintptr(size)))
	return tensor.New(opts...), nil
}

// denseBytes returns the bytes of a C-order *tensor.Dense and its dtype. A
// Dense that is a non-contiguous view (after a transpose, say) is copied into
// C order first; otherwise the slice aliases d's memory.
func denseBytes(d *tensor.Dense) ([]byte, memmap.DType, error) {
	dt, err := DTypeOf(d.Dtype())
	if err != nil {
		return nil, memmap.Invalid, err
	}
	if d.RequiresIterator() || d.DataOrder().IsColMajor() {
		m, ok := tensor.Materialize(d).(*tensor.Dense)
		if !ok {
			return nil, memmap.Invalid, fmt.Errorf("%w: cannot materialize %T", memmap.ErrShape, d)
		}
		d = m
	}
	size, err := memmap.NumBytes(dt, d.Shape())
	if err != nil {
		return nil, memmap.Invalid, err
	}
	if size == 0 {
		return []byte{}, dt, nil
	}
	raw := d.Header.Raw // gorgonia's backing bytes, promoted from its array
	if len(raw) < size {
		return nil, memmap.Invalid, fmt.Errorf("%w: Dense holds %d bytes, its shape %v needs %d", memmap.ErrShape, len(raw), d.Shape(), size)
	}
	return raw[:size:size], dt, nil
}
