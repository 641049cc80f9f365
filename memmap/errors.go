package memmap

import "errors"

// Errors returned by this package. Callers branch on them with errors.Is; the
// returned errors wrap them with the file and the detail.
var (
	// ErrDType is returned for an unknown or unsupported dtype, or a dtype
	// that does not match the one expected.
	ErrDType = errors.New("memmap: bad dtype")

	// ErrShape is returned for a negative dimension, a shape whose byte size
	// overflows, or a buffer or tensor whose shape does not match.
	ErrShape = errors.New("memmap: bad shape")

	// ErrIndex is returned for a row index or range outside the tensor.
	ErrIndex = errors.New("memmap: index out of range")

	// ErrShortFile is returned by Open when the file holds fewer bytes than
	// its dtype and shape need.
	ErrShortFile = errors.New("memmap: file shorter than its shape")

	// ErrClosed is returned by every method of a Tensor after Close.
	ErrClosed = errors.New("memmap: tensor is closed")

	// ErrReadOnly is returned when writing to a tensor opened read-only.
	ErrReadOnly = errors.New("memmap: tensor is read-only")

	// ErrFault is returned when touching the mapped memory faulted, which
	// happens when the file was truncated by someone else while mapped or
	// the disk failed. The process survives; the data in question is lost.
	ErrFault = errors.New("memmap: fault while accessing mapped memory")
)
