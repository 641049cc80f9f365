package memmap

import (
	"fmt"
	"io"
)

// Gather copies the given rows, in order, into dst, which must hold exactly
// len(rows)*RowBytes() bytes. Rows may repeat. Every index is checked before
// any byte is copied: an index out of range returns ErrIndex and copies
// nothing.
func (t *Tensor) Gather(dst []byte, rows []int) error {
	if err := t.checkRows(rows, len(dst), "gather"); err != nil {
		return err
	}
	if err := t.acquire(false); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	rs := t.rowSize
	return guarded(t.path, func() {
		for i, r := range rows {
			copy(dst[i*rs:(i+1)*rs], t.data[r*rs:(r+1)*rs])
		}
	})
}

// Scatter copies src, which must hold exactly len(rows)*RowBytes() bytes,
// into the given rows, in order; when a row repeats, the last copy wins.
// Every index is checked before any byte is written.
func (t *Tensor) Scatter(rows []int, src []byte) error {
	if err := t.checkRows(rows, len(src), "scatter"); err != nil {
		return err
	}
	if err := t.acquire(true); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	rs := t.rowSize
	return guarded(t.path, func() {
		for i, r := range rows {
			copy(t.data[r*rs:(r+1)*rs], src[i*rs:(i+1)*rs])
		}
	})
}

// Fill sets every element of the given rows to the element whose bytes are
// elem (exactly DType().Size() bytes, little-endian). Every index is checked
// before any byte is written.
func (t *Tensor) Fill(rows []int, elem []byte) error {
	if len(elem) != t.dtype.Size() {
		return fmt.Errorf("fill %s: %w: element of %d bytes for %v", t.path, ErrDType, len(elem), t.dtype)
	}
	if err := t.checkRows(rows, len(rows)*t.rowSize, "fill"); err != nil {
		return err
	}
	if err := t.acquire(true); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	if len(rows) == 0 || t.rowSize == 0 {
		return nil
	}
	rs := t.rowSize
	return guarded(t.path, func() {
		first := t.data[rows[0]*rs : (rows[0]+1)*rs]
		repeat(first, elem)
		for _, r := range rows[1:] {
			copy(t.data[r*rs:(r+1)*rs], first)
		}
	})
}

// repeat fills dst with copies of pattern, doubling the copied prefix each
// step so that a large fill costs a few memmoves, not one per element.
func repeat(dst, pattern []byte) {
	n := copy(dst, pattern)
	for n < len(dst) {
		n += copy(dst[n:], dst[:n])
	}
}

// checkRows validates a row operation on t before it touches data.
func (t *Tensor) checkRows(rows []int, nbytes int, op string) error {
	if len(t.shape) == 0 {
		return fmt.Errorf("%s %s: %w: a scalar has no rows", op, t.path, ErrShape)
	}
	if nbytes != len(rows)*t.rowSize {
		return fmt.Errorf("%s %s: %w: %d bytes for %d rows of %d bytes",
			op, t.path, ErrShape, nbytes, len(rows), t.rowSize)
	}
	if err := CheckRows(rows, t.shape[0]); err != nil {
		return fmt.Errorf("%s %s: %w", op, t.path, err)
	}
	return nil
}

// ReadAt copies data bytes starting at byte offset off into p, as
// io.ReaderAt specifies: fewer than len(p) bytes only at the end of the data,
// with io.EOF.
func (t *Tensor) ReadAt(p []byte, off int64) (n int, err error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s: %w: negative offset %d", t.path, ErrIndex, off)
	}
	if err := t.acquire(false); err != nil {
		return 0, err
	}
	defer t.mu.RUnlock()
	if off >= int64(t.size) {
		return 0, io.EOF
	}
	err = guarded(t.path, func() { n = copy(p, t.data[off:]) })
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// WriteAt copies p into the data starting at byte offset off. Unlike a file,
// the tensor does not grow: a write past the end returns ErrIndex and writes
// nothing.
func (t *Tensor) WriteAt(p []byte, off int64) (n int, err error) {
	if off < 0 || off > int64(t.size) || int64(len(p)) > int64(t.size)-off {
		return 0, fmt.Errorf("write %s: %w: %d bytes at offset %d of %d",
			t.path, ErrIndex, len(p), off, t.size)
	}
	if err := t.acquire(true); err != nil {
		return 0, err
	}
	defer t.mu.RUnlock()
	err = guarded(t.path, func() { n = copy(t.data[off:], p) })
	return n, err
}
