package tensordict

import (
	"fmt"
	"io"
	"math"
	"net"

	"github.com/tensorwire/tensorwire/memmap"
)

// ReadAt copies t's data from byte offset off into p, as io.ReaderAt
// specifies: fewer than len(p) bytes only at the end, with io.EOF.
func (t *Tensor) ReadAt(p []byte, off int64) (int, error) {
	n := int64(t.NumBytes())
	if off < 0 {
		return 0, fmt.Errorf("%w: negative offset %d", memmap.ErrIndex, off)
	}
	if off >= n {
		return 0, io.EOF
	}
	want := min(int64(len(p)), n-off)
	if err := t.readAt(p[:want], int(off)); err != nil {
		return 0, err
	}
	if want < int64(len(p)) {
		return int(want), io.EOF
	}
	return int(want), nil
}

// WriteAt copies p into t's data at byte offset off. A tensor does not grow:
// a write past the end returns memmap.ErrIndex and writes nothing.
func (t *Tensor) WriteAt(p []byte, off int64) (int, error) {
	n := int64(t.NumBytes())
	if off < 0 || off > n || int64(len(p)) > n-off {
		return 0, fmt.Errorf("%w: %d bytes at offset %d of %d", memmap.ErrIndex, len(p), off, n)
	}
	if err := t.writeAt(p, int(off)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Stats are summary figures of a tensor's elements, as float64.
type Stats struct {
	Count         int     // number of elements
	Min, Max, Sum float64 // NaN if any element is NaN, as in torch; Sum also when +Inf meets -Inf
}

// Stats streams through t's elements (in chunks, so a mapped tensor larger
// than memory is fine) and returns their count, min, max and sum. Complex
// tensors return an error wrapping memmap.ErrDType; a tensor without
// elements returns Count 0 and NaN figures.
func (t *Tensor) Stats() (Stats, error) {
	if !t.dtype.Real() {
		return Stats{}, fmt.Errorf("%w: no ordering for %v", memmap.ErrDType, t.dtype)
	}
	s := Stats{Min: math.Inf(1), Max: math.Inf(-1)}
	size := t.dtype.Size()
	err := t.chunks(func(_ int, b []byte) error {
		for i := 0; i+size <= len(b); i += size {
			v := t.dtype.Float64(b[i:])
			s.Sum += v
			if v < s.Min || math.IsNaN(v) {
				s.Min = v
			}
			if v > s.Max || math.IsNaN(v) {
				s.Max = v
			}
		}
		return nil
	})
	if err != nil {
		return Stats{}, err
	}
	s.Count = t.NumElements()
	if s.Count == 0 {
		s.Min, s.Max, s.Sum = math.NaN(), math.NaN(), math.NaN()
	}
	return s, nil
}

// CheckFile returns an error wrapping memmap.ErrFault when t is mapped and
// its file no longer holds all of its data (truncated under the mapping):
// memmap.Tensor.CheckFile, for a caller about to commit to sending t's
// bytes. A tensor in Go memory has no file to check: nil.
func (t *Tensor) CheckFile() error {
	if t.mm == nil {
		return nil
	}
	return t.mm.CheckFile()
}

// GatherTo writes the given rows of t, in order, to w and returns how many
// bytes it wrote; rows nil writes all of t's bytes (a scalar's too). Every
// index is checked before any byte is written. A mapped tensor's rows go
// as memmap.Tensor.GatherTo sends them: straight from the mapping when w
// writes to a file descriptor (a socket, a file), the kernel copying once.
// A Go-memory tensor's rows go to w as slices of its memory, consecutive
// rows as one piece (one writev on a socket). An error may come after some
// bytes were written.
func (t *Tensor) GatherTo(w io.Writer, rows []int) (int64, error) {
	rb := t.RowBytes()
	if rows == nil {
		// All of t as one row of all its bytes: a scalar's, too.
		rb, rows = t.NumBytes(), []int{0}
	} else if err := t.checkRowsOf(rows); err != nil {
		return 0, err
	}
	if t.mm != nil {
		return t.mm.GatherTo(w, t.off, rb, rows)
	}
	bufs := make(net.Buffers, 0, len(rows))
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j] == rows[j-1]+1 {
			j++
		}
		bufs = append(bufs, t.heap[rows[i]*rb:rows[j-1]*rb+rb])
		i = j
	}
	return bufs.WriteTo(w)
}
