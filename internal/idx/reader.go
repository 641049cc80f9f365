package idx

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/tensorwire/tensorwire/internal/array"
	"github.com/tensorwire/tensorwire/internal/swap"
)

// A Reader is a decoded IDX file: its header, then its data as
// little-endian bytes.
type Reader = array.Reader

// A ReadCloser is a Reader for a file opened by Open.
type ReadCloser = array.File

// NewReader reads the header of the IDX file in r and returns a Reader for
// its data. If r starts with the gzip magic number 1f 8b, the file is
// decompressed as it is read.
//
// After exactly Header().NumBytes() bytes, Read returns io.EOF if the input
// ends there. The format has no trailer, so bytes after the data mean the
// header is wrong: Read then returns an error wrapping ErrFormat instead.
// If the input ends before the data does, Read returns an error wrapping
// ErrFormat and io.ErrUnexpectedEOF. Errors are sticky.
//
// An error about the content of r wraps ErrFormat (and io.ErrUnexpectedEOF
// if r ends inside the header); an error returned by r is wrapped as is.
// Memory use is bounded whatever sizes the header claims.
func NewReader(r io.Reader) (*Reader, error) {
	src, err := decompress(r)
	if err != nil {
		return nil, err
	}
	var magic [4]byte
	if _, err := io.ReadFull(src, magic[:]); err != nil {
		return nil, readError("reading magic number", err)
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("%w: magic number % x does not start with two zero bytes", ErrFormat, magic)
	}
	dtype, ok := dtypes[magic[2]]
	if !ok {
		return nil, fmt.Errorf("%w: unknown type byte 0x%02x", ErrFormat, magic[2])
	}
	rank := int(magic[3])
	if rank == 0 || rank > MaxDims {
		return nil, fmt.Errorf("%w: %d dimensions, want 1 to %d", ErrFormat, rank, MaxDims)
	}
	var dims [4 * MaxDims]byte
	if _, err := io.ReadFull(src, dims[:4*rank]); err != nil {
		return nil, readError("reading dimensions", err)
	}
	shape := make([]int, rank)
	for i := range shape {
		d := binary.BigEndian.Uint32(dims[4*i:])
		if uint64(d) > math.MaxInt {
			return nil, fmt.Errorf("%w: dimension %d is %d, too large for int", ErrFormat, i, d)
		}
		shape[i] = int(d)
	}
	h := Header{DType: dtype, Shape: shape}
	n := h.NumBytes()
	if n < 0 {
		return nil, fmt.Errorf("%w: %s shape %v overflows int64 bytes", ErrFormat, dtype, shape)
	}
	data := swap.NewReader(src, dtype.Size(), n, ErrFormat,
		func(err error) error { return readError("reading data", err) },
		func() error { return checkEnd(src, n) })
	return array.NewReader(h, data), nil
}

// checkEnd checks that src, having yielded the n data bytes, holds nothing
// more: the format has no trailer. It returns nil if src is at its end. For
// gzip input, reading to the end of the stream is also what verifies its
// checksum.
func checkEnd(src io.Reader, n int64) error {
	var b [1]byte
	k, err := io.ReadAtLeast(src, b[:], 1)
	switch {
	case k > 0:
		return fmt.Errorf("%w: trailing bytes after the %d data bytes", ErrFormat, n)
	case errors.Is(err, io.EOF):
		return nil
	default:
		return readError("checking for bytes after the data", err)
	}
}

// Open opens the named IDX file, gzip-compressed or not, and reads its
// header. Its errors, and those of Read, start with the file name. The caller
// must Close the ReadCloser.
func Open(name string) (*ReadCloser, error) { return array.Open(name, NewReader) }

// decompress returns r, or a gzip reader for r if r starts with the gzip
// magic number.
func decompress(r io.Reader) (io.Reader, error) {
	var head [2]byte
	n, err := io.ReadFull(r, head[:])
	src := io.MultiReader(bytes.NewReader(head[:n]), r)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return src, nil // too short for anything: reading the magic reports it
		}
		return nil, readError("reading magic number", err)
	}
	if head != [2]byte{0x1f, 0x8b} {
		return src, nil
	}
	zr, err := gzip.NewReader(src)
	if err != nil {
		return nil, readError("reading gzip header", err)
	}
	return zr, nil
}

// readError wraps an error met while doing what. Truncation and gzip
// corruption are format errors; anything else is an error of the underlying
// reader and is wrapped as is.
func readError(what string, err error) error {
	var corrupt flate.CorruptInputError
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: %s: %w", ErrFormat, what, io.ErrUnexpectedEOF)
	case errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt):
		return fmt.Errorf("%w: %s: %w", ErrFormat, what, err)
	default:
		return fmt.Errorf("idx: %s: %w", what, err)
	}
}
