package tensordict

import (
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/tensorwire/tensorwire/memmap"
)

// Tensor is one leaf of a TensorDict: a C-order n-dimensional array of one
// dtype, stored either in Go memory or in a memory-mapped file (a
// memmap.Tensor, or a view of rows of one).
//
// Row operations (Row, Slice) return views that share storage; Gather returns
// a copy in Go memory. A Tensor backed by a mapping is usable until the
// TensorDict that owns the mapping is closed; after that its methods return
// an error wrapping memmap.ErrClosed. Its methods are safe for concurrent use
// as far as the storage is: concurrent writes to the same rows race.
type Tensor struct {
	dtype memmap.DType
	shape []int
	heap  []byte         // Go-memory storage, exactly NumBytes long; nil when mapped
	mm    *memmap.Tensor // mapped storage; nil for Go memory
	off   int64          // byte offset of this view within mm
}

// Element is the set of Go types a Tensor can be built from or read into:
// the basic types only, so that the compiler refuses a named type (whose
// layout this package cannot vouch for; use FromBytes).
type Element interface {
	bool | uint8 | int8 | int16 | uint16 | int32 | uint32 | int64 | uint64 |
		float32 | float64 | complex64 | complex128
}

// dtypeFor returns the DType whose elements have the layout of E.
func dtypeFor[E Element]() memmap.DType {
	var z E
	switch any(z).(type) {
	case bool:
		return memmap.Bool
	case uint8:
		return memmap.Uint8
	case int8:
		return memmap.Int8
	case int16:
		return memmap.Int16
	case uint16:
		return memmap.Uint16
	case int32:
		return memmap.Int32
	case uint32:
		return memmap.Uint32
	case int64:
		return memmap.Int64
	case uint64:
		return memmap.Uint64
	case float32:
		return memmap.Float32
	case float64:
		return memmap.Float64
	case complex64:
		return memmap.Complex64
	case complex128:
		return memmap.Complex128
	}
	return memmap.Invalid // unreachable: Element lists only the types above
}

// Zeros returns a zero-filled Tensor in Go memory.
func Zeros(dt memmap.DType, shape ...int) (*Tensor, error) {
	n, err := memmap.NumBytes(dt, shape)
	if err != nil {
		return nil, err
	}
	return &Tensor{dtype: dt, shape: slices.Clone(shape), heap: make([]byte, n)}, nil
}

// FromBytes returns a Tensor of dtype dt and shape shape over data, which
// must hold exactly the tensor's bytes (little-endian, C order). The Tensor
// aliases data: no copy is made.
func FromBytes(dt memmap.DType, shape []int, data []byte) (*Tensor, error) {
	n, err := memmap.NumBytes(dt, shape)
	if err != nil {
		return nil, err
	}
	if len(data) != n {
		return nil, fmt.Errorf("%w: %d bytes for %v %v (%d bytes)", memmap.ErrShape, len(data), dt, shape, n)
	}
	return &Tensor{dtype: dt, shape: slices.Clone(shape), heap: data[:n:n]}, nil
}

// FromSlice returns a Tensor of the given shape over data, whose length must
// be the shape's number of elements; with no shape it is a 1-d tensor of
// len(data). The Tensor aliases data: no copy is made. The dtype follows E
// (int64 is torch.int64, and so on). A slice of a named type does not
// compile: convert it, or use FromBytes.
func FromSlice[E Element](data []E, shape ...int) (*Tensor, error) {
	dt := dtypeFor[E]()
	if len(shape) == 0 {
		shape = []int{len(data)}
	}
	var b []byte
	if len(data) > 0 {
		b = unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), len(data)*dt.Size())
	}
	return FromBytes(dt, shape, b)
}

// WithDType returns a Tensor sharing t's storage whose elements are read as
// dtype dt, which must have the same item size (uint16 to float16, say).
func (t *Tensor) WithDType(dt memmap.DType) (*Tensor, error) {
	if dt.Size() != t.dtype.Size() {
		return nil, fmt.Errorf("%w: %v elements are %d bytes, %v are %d",
			memmap.ErrDType, t.dtype, t.dtype.Size(), dt, dt.Size())
	}
	u := *t
	u.dtype = dt
	return &u, nil
}

// Values returns a copy of t's elements as a []E. E must match t's dtype
// (float16 and bfloat16 read as uint16 bits).
func Values[E Element](t *Tensor) ([]E, error) {
	dt := dtypeFor[E]()
	want := t.dtype.Bits()
	if dt != want {
		return nil, fmt.Errorf("%w: %v tensor read as %T", memmap.ErrDType, t.dtype, *new(E))
	}
	out := make([]E, t.NumElements())
	if len(out) == 0 {
		return out, nil
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), len(out)*dt.Size())
	if err := t.readAt(b, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// DType returns the element type.
func (t *Tensor) DType() memmap.DType { return t.dtype }

// Shape returns a copy of the shape.
func (t *Tensor) Shape() []int { return slices.Clone(t.shape) }

// Len returns the number of rows (the first dimension), or 0 for a scalar.
func (t *Tensor) Len() int {
	if len(t.shape) == 0 {
		return 0
	}
	return t.shape[0]
}

// NumElements returns the number of elements.
func (t *Tensor) NumElements() int {
	n, _ := memmap.NumElements(t.shape) // validated when t was built
	return n
}

// NumBytes returns the size of the data in bytes.
func (t *Tensor) NumBytes() int { return t.NumElements() * t.dtype.Size() }

// RowBytes returns the size of one row in bytes, or 0 for a scalar.
func (t *Tensor) RowBytes() int { return memmap.RowBytes(t.dtype, t.shape) }

// Mapped reports whether t's storage is a memory-mapped file.
func (t *Tensor) Mapped() bool { return t.mm != nil }

// Path returns the file backing t, or "" for a tensor in Go memory.
func (t *Tensor) Path() string {
	if t.mm == nil {
		return ""
	}
	return t.mm.Path()
}

// Bytes returns t's data without copying: t's Go memory, or the mapped bytes
// of t's view. Mapped bytes are valid only until the owning TensorDict is
// closed, and accesses to them are not guarded against faults; prefer Gather
// or Values where a copy will do.
func (t *Tensor) Bytes() ([]byte, error) {
	if t.mm == nil {
		return t.heap, nil
	}
	all, err := t.mm.Bytes()
	if err != nil {
		return nil, err
	}
	n := int64(t.NumBytes())
	return all[t.off : t.off+n : t.off+n], nil
}

// String returns a short description, like torch's repr of a tensor's
// metadata: "Tensor(shape=[4 3], dtype=torch.float32)".
func (t *Tensor) String() string {
	kind := "Tensor"
	if t.mm != nil {
		kind = "MemoryMappedTensor"
	}
	return fmt.Sprintf("%s(shape=%v, dtype=%v)", kind, t.shape, t.dtype)
}

// readAt copies len(dst) bytes of t's data, from byte offset off, into dst.
// The range must lie inside the data.
func (t *Tensor) readAt(dst []byte, off int) error {
	if t.mm == nil {
		copy(dst, t.heap[off:])
		return nil
	}
	if len(dst) == 0 {
		return nil
	}
	_, err := t.mm.ReadAt(dst, t.off+int64(off))
	return err
}

// chunkSize bounds the buffer used to stream mapped data.
const chunkSize = 4 << 20

// chunks calls fn with t's data in consecutive pieces: t's own memory for a
// Go-memory tensor, a reused buffer of at most chunkSize bytes for a mapped
// one (valid only during the call).
func (t *Tensor) chunks(fn func(off int, b []byte) error) error {
	n := t.NumBytes()
	if t.mm == nil {
		return fn(0, t.heap)
	}
	buf := make([]byte, min(n, chunkSize))
	for off := 0; off < n; off += len(buf) {
		b := buf[:min(len(buf), n-off)]
		if err := t.readAt(b, off); err != nil {
			return err
		}
		if err := fn(off, b); err != nil {
			return err
		}
	}
	return nil
}

// writeAt copies src into t's data at byte offset off.
func (t *Tensor) writeAt(src []byte, off int) error {
	if t.mm == nil {
		copy(t.heap[off:], src)
		return nil
	}
	if len(src) == 0 {
		return nil
	}
	_, err := t.mm.WriteAt(src, t.off+int64(off))
	return err
}

// copyFrom copies all of src's data (same byte size) into t.
func (t *Tensor) copyFrom(src *Tensor) error {
	if t.mm == nil {
		// Into Go memory: one copy, straight from src's mapping (or
		// memory), with no chunk between.
		return src.readAt(t.heap[:src.NumBytes()], 0)
	}
	return src.chunks(func(off int, b []byte) error { return t.writeAt(b, off) })
}

// Clone returns a copy of t in Go memory.
func (t *Tensor) Clone() (*Tensor, error) {
	c, err := Zeros(t.dtype, t.shape...)
	if err != nil {
		return nil, err
	}
	if err := t.readAt(c.heap, 0); err != nil {
		return nil, err
	}
	return c, nil
}

// Equal reports whether u has t's dtype, shape and bytes (bitwise equality:
// a NaN equals the same NaN, -0 does not equal +0). Data that cannot be read
// (a closed mapping) makes the tensors unequal.
func (t *Tensor) Equal(u *Tensor) bool {
	if t.dtype != u.dtype || !slices.Equal(t.shape, u.shape) {
		return false
	}
	if t.mm == nil && u.mm == nil {
		return string(t.heap) == string(u.heap)
	}
	ub := make([]byte, min(t.NumBytes(), chunkSize))
	err := t.chunks(func(off int, b []byte) error {
		if err := u.readAt(ub[:len(b)], off); err != nil {
			return err
		}
		if string(b) != string(ub[:len(b)]) {
			return errUnequal
		}
		return nil
	})
	return err == nil
}

var errUnequal = errors.New("unequal")

// Mapping returns the memmap.Tensor that backs t and the byte offset of t's
// view within it, or nil and 0 for a tensor in Go memory. Together with
// Shape and DType it names t's data exactly, which is what a reference to
// shared storage ships instead of the bytes. The memmap.Tensor stays owned by
// whoever opened it.
func (t *Tensor) Mapping() (*memmap.Tensor, int64) { return t.mm, t.off }

// View returns a Tensor of the given shape over mm's data starting at byte
// offset off, with mm's dtype. It shares mm's storage and lifetime: once mm
// is closed, t's methods return errors wrapping memmap.ErrClosed. A view that
// does not fit inside mm is an error wrapping memmap.ErrShape.
func View(mm *memmap.Tensor, off int64, shape ...int) (*Tensor, error) {
	n, err := memmap.NumBytes(mm.DType(), shape)
	if err != nil {
		return nil, err
	}
	if off < 0 || off > int64(mm.NumBytes()) || int64(n) > int64(mm.NumBytes())-off {
		return nil, fmt.Errorf("%w: view of %d bytes at offset %d of a %d-byte %v",
			memmap.ErrShape, n, off, mm.NumBytes(), mm.DType())
	}
	if elem := int64(mm.DType().Size()); off%elem != 0 {
		return nil, fmt.Errorf("%w: offset %d is not a multiple of the %d-byte element", memmap.ErrShape, off, elem)
	}
	return &Tensor{dtype: mm.DType(), shape: slices.Clone(shape), mm: mm, off: off}, nil
}
