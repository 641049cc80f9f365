package memmap

import (
	"fmt"
	"unsafe"

	"gorgonia.org/tensor"
)

// Dense returns a *tensor.Dense that aliases the whole mapping: no bytes are
// copied, and writes through it reach the file (for a read-write tensor).
// Float16 and BFloat16 tensors give a uint16 view of their raw bits.
//
// The view is valid only until Close; see the package documentation. Avoid
// gorgonia operations that move data in place, such as T and Transpose, on a
// view: they rewrite the file.
func (t *Tensor) Dense() (*tensor.Dense, error) {
	if err := t.acquire(false); err != nil {
		return nil, err
	}
	defer t.mu.RUnlock()
	return DenseView(t.dtype, t.shape, t.data)
}

// Bytes returns the mapped data as a byte slice, for zero-copy I/O (a
// network write, a hash). It aliases the mapping and is valid only until
// Close; accesses through it are not guarded against faults.
func (t *Tensor) Bytes() ([]byte, error) {
	if err := t.acquire(false); err != nil {
		return nil, err
	}
	defer t.mu.RUnlock()
	return t.data[:t.size:t.size], nil
}

// DenseView returns a *tensor.Dense of dtype dt and shape shape over data,
// which must hold exactly NumBytes(dt, shape) bytes and outlive the view.
// Zero-element tensors get a Dense with its own (empty) storage, since
// gorgonia cannot view zero bytes.
func DenseView(dt DType, shape []int, data []byte) (d *tensor.Dense, err error) {
	size, err := NumBytes(dt, shape)
	if err != nil {
		return nil, err
	}
	if len(data) != size {
		return nil, fmt.Errorf("%w: %d bytes for %v %v (%d bytes)", ErrShape, len(data), dt, shape, size)
	}
	defer func() {
		// gorgonia panics on shapes it does not support; keep that inside.
		if r := recover(); r != nil {
			d, err = nil, fmt.Errorf("%w: gorgonia cannot view %v %v: %v", ErrShape, dt, shape, r)
		}
	}()
	opts := []tensor.ConsOpt{tensor.Of(dt.Dense())}
	if len(shape) > 0 {
		opts = append(opts, tensor.WithShape(shape...))
	}
	if size == 0 {
		return tensor.New(opts...), nil
	}
	opts = append(opts, tensor.FromMemory(uintptr(unsafe.Pointer(&data[0])), uintptr(size)))
	return tensor.New(opts...), nil
}

// DenseBytes returns the bytes of a C-order *tensor.Dense and its DType. A
// Dense that is a non-contiguous view (after a transpose, say) is copied into
// C order first; otherwise the slice aliases d's memory.
func DenseBytes(d *tensor.Dense) ([]byte, DType, error) {
	dt, err := DTypeOf(d.Dtype())
	if err != nil {
		return nil, Invalid, err
	}
	if d.RequiresIterator() || d.DataOrder().IsColMajor() {
		m, ok := tensor.Materialize(d).(*tensor.Dense)
		if !ok {
			return nil, Invalid, fmt.Errorf("%w: cannot materialize %T", ErrShape, d)
		}
		d = m
	}
	size, err := NumBytes(dt, d.Shape())
	if err != nil {
		return nil, Invalid, err
	}
	if size == 0 {
		return []byte{}, dt, nil
	}
	raw := d.Header.Raw // gorgonia's backing bytes, promoted from its array
	if len(raw) < size {
		return nil, Invalid, fmt.Errorf("%w: Dense holds %d bytes, its shape %v needs %d", ErrShape, len(raw), d.Shape(), size)
	}
	return raw[:size:size], dt, nil
}

// FromDense creates a file at path (as Create does) holding a copy of d's
// elements, and returns it mapped read-write.
func FromDense(path string, d *tensor.Dense) (*Tensor, error) {
	src, dt, err := DenseBytes(d)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	t, err := Create(path, dt, d.Shape()...)
	if err != nil {
		return nil, err
	}
	if _, err := t.WriteAt(src, 0); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}
