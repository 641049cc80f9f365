package memmap

import (
	"fmt"
	"io"
	"math"

	"github.com/tensorwire/tensorwire/internal/rowcopy"
)

// Gather copies the given rows, in order, into dst, which must hold exactly
// len(rows)*RowBytes() bytes. Rows may repeat. Every index is checked before
// any byte is copied: an index out of range returns ErrIndex and copies
// nothing.
func (t *Tensor) Gather(dst []byte, rows []int) error {
	if err := t.checkRank("gather", rows); err != nil {
		return err
	}
	return t.GatherAt(dst, 0, t.rowSize, rows)
}

// Scatter copies src, which must hold exactly len(rows)*RowBytes() bytes,
// into the given rows, in order; when a row repeats, the last copy wins.
// Every index is checked before any byte is written. A write the system
// refuses (a full disk under a sparse file: ENOSPC) returns an error
// wrapping the system's; see the package documentation, "Writes", for what
// it leaves.
func (t *Tensor) Scatter(rows []int, src []byte) error {
	if err := t.checkRank("scatter", rows); err != nil {
		return err
	}
	return t.ScatterAt(0, t.rowSize, rows, src)
}

// Fill sets every element of the given rows to the element whose bytes are
// elem (exactly DType().Size() bytes, little-endian). Every index is checked
// before any byte is written. Errors are as Scatter's.
func (t *Tensor) Fill(rows []int, elem []byte) error {
	if err := t.checkRank("fill", rows); err != nil {
		return err
	}
	return t.FillAt(0, t.rowSize, rows, elem)
}

// GatherAt is Gather over a view of the data: rows of rowBytes bytes that
// start at byte offset off, so that row r is the bytes [off+r*rowBytes,
// off+(r+1)*rowBytes). A row that would reach past the data is ErrIndex.
// Views of views (a row of a row) use it with their own offsets.
func (t *Tensor) GatherAt(dst []byte, off int64, rowBytes int, rows []int) error {
	if err := t.checkView("gather", off, rowBytes, rows, len(dst)); err != nil {
		return err
	}
	if err := t.acquire(false); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	t.prefetch(off, rowBytes, rows)
	return guarded(t.path, func() { rowcopy.Gather(dst, t.data[off:], rowBytes, rows) })
}

// ScatterAt is Scatter over a view of the data, as GatherAt.
func (t *Tensor) ScatterAt(off int64, rowBytes int, rows []int, src []byte) error {
	if err := t.checkView("scatter", off, rowBytes, rows, len(src)); err != nil {
		return err
	}
	if err := t.acquire(true); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	return t.scatter(off, rowBytes, rows, src)
}

// FillAt is Fill over a view of the data, as GatherAt.
func (t *Tensor) FillAt(off int64, rowBytes int, rows []int, elem []byte) error {
	if len(elem) != t.dtype.Size() || rowBytes%len(elem) != 0 {
		return fmt.Errorf("fill %s: %w: element of %d bytes for %v rows of %d bytes",
			t.path, ErrDType, len(elem), t.dtype, rowBytes)
	}
	if err := t.checkView("fill", off, rowBytes, rows, len(rows)*rowBytes); err != nil {
		return err
	}
	if err := t.acquire(true); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	return t.fill(off, rowBytes, rows, elem)
}

// scatterMapped is ScatterAt's copy through the mapping, for rows that
// are resident and wherever pwrite is not used (see direct_linux.go). The
// caller holds t.mu.
func (t *Tensor) scatterMapped(off int64, rowBytes int, rows []int, src []byte) error {
	t.prefetch(off, rowBytes, rows)
	return guarded(t.path, func() { rowcopy.Scatter(t.data[off:], src, rowBytes, rows) })
}

// fillMapped is FillAt's fill through the mapping, as scatterMapped.
func (t *Tensor) fillMapped(off int64, rowBytes int, rows []int, elem []byte) error {
	return guarded(t.path, func() { rowcopy.Fill(t.data[off:], rowBytes, rows, elem) })
}

// writeMapped is WriteAt's copy through the mapping, as scatterMapped.
func (t *Tensor) writeMapped(p []byte, off int64) (n int, err error) {
	err = guarded(t.path, func() { n = copy(t.data[off:], p) })
	return n, err
}

// checkRank is the check Gather, Scatter and Fill add to their view
// counterparts: the tensor has rows, and the indices are among them (which
// the view check cannot tell when rows have zero bytes).
func (t *Tensor) checkRank(op string, rows []int) error {
	if len(t.shape) == 0 {
		return fmt.Errorf("%s %s: %w: a scalar has no rows", op, t.path, ErrShape)
	}
	if err := CheckRows(rows, t.shape[0]); err != nil {
		return fmt.Errorf("%s %s: %w", op, t.path, err)
	}
	return nil
}

// checkView validates a row operation on a view before it touches data: the
// buffer size, and every row inside the data.
func (t *Tensor) checkView(op string, off int64, rowBytes int, rows []int, nbytes int) error {
	if rowBytes < 0 || off < 0 || off > int64(t.size) {
		return fmt.Errorf("%s %s: %w: rows of %d bytes at offset %d of %d",
			op, t.path, ErrIndex, rowBytes, off, t.size)
	}
	if nbytes != len(rows)*rowBytes {
		return fmt.Errorf("%s %s: %w: %d bytes for %d rows of %d bytes",
			op, t.path, ErrShape, nbytes, len(rows), rowBytes)
	}
	// Rows of zero bytes touch no data, so any index is safe here; how many
	// rows the view has is its owner's to check (Gather, tensordict).
	n := math.MaxInt
	if rowBytes > 0 {
		n = int((int64(t.size) - off) / int64(rowBytes))
	}
	if err := CheckRows(rows, n); err != nil {
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
// nothing. Other errors are as Scatter's; n counts the bytes from off
// written before one.
func (t *Tensor) WriteAt(p []byte, off int64) (n int, err error) {
	if off < 0 || off > int64(t.size) || int64(len(p)) > int64(t.size)-off {
		return 0, fmt.Errorf("write %s: %w: %d bytes at offset %d of %d",
			t.path, ErrIndex, len(p), off, t.size)
	}
	if err := t.acquire(true); err != nil {
		return 0, err
	}
	defer t.mu.RUnlock()
	return t.write(p, off)
}
