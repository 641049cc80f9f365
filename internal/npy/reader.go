package npy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/tensorwire/tensorwire/internal/array"
	"github.com/tensorwire/tensorwire/internal/swap"
)

// magic starts every .npy file.
const magic = "\x93NUMPY"

// A Reader is a decoded .npy array: its header, then its data as
// little-endian bytes in C order.
type Reader = array.Reader

// A ReadCloser is a Reader for a file opened by Open.
type ReadCloser = array.File

// NewReader reads the preamble and header of the .npy array in r and
// returns a Reader for its data. Format versions 1.0, 2.0 and 3.0 are
// accepted.
//
// Read returns io.EOF after exactly Header().NumBytes() bytes. If the input
// ends before, it returns an error wrapping ErrFormat and
// io.ErrUnexpectedEOF. Errors are sticky.
//
// The Reader reads exactly the array from r and nothing past it, so that
// the arrays of a stream written by repeated np.save calls can be read
// with successive NewReader calls. NewReader returns io.EOF, unwrapped, if
// r is at its end before the first byte.
//
// An error about the content of r wraps ErrFormat (and io.ErrUnexpectedEOF
// if r ends inside the header) or ErrUnsupported; an error returned by r is
// wrapped as is. Memory use is bounded whatever sizes the header claims.
func NewReader(r io.Reader) (*Reader, error) {
	var pre [len(magic) + 2]byte
	if n, err := io.ReadFull(r, pre[:]); err != nil {
		if n == 0 && err == io.EOF {
			return nil, io.EOF
		}
		return nil, readError("reading magic string", err)
	}
	if string(pre[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: magic string %q, want %q", ErrFormat, pre[:len(magic)], magic)
	}
	var size [4]byte
	var hlen int
	switch major, minor := pre[len(magic)], pre[len(magic)+1]; {
	case major == 1 && minor == 0:
		if _, err := io.ReadFull(r, size[:2]); err != nil {
			return nil, readError("reading header length", err)
		}
		hlen = int(binary.LittleEndian.Uint16(size[:]))
	case (major == 2 || major == 3) && minor == 0:
		if _, err := io.ReadFull(r, size[:]); err != nil {
			return nil, readError("reading header length", err)
		}
		n := binary.LittleEndian.Uint32(size[:])
		if n > maxHeaderLen {
			return nil, fmt.Errorf("%w: header length %d exceeds %d", ErrFormat, n, maxHeaderLen)
		}
		hlen = int(n)
	default:
		return nil, fmt.Errorf("%w: format version %d.%d", ErrUnsupported, major, minor)
	}
	// Read the header as it arrives rather than allocate hlen up front.
	text, err := io.ReadAll(io.LimitReader(r, int64(hlen)))
	if err != nil {
		return nil, readError("reading header", err)
	}
	if len(text) < hlen {
		return nil, readError("reading header", io.ErrUnexpectedEOF)
	}
	h, width, err := parseHeader(string(text))
	if err != nil {
		return nil, err
	}
	data := swap.NewReader(r, width, h.NumBytes(), ErrFormat, // parseHeader checked the size
		func(err error) error { return readError("reading data", err) }, nil)
	return array.NewReader(h, data), nil
}

// Open opens the named .npy file and reads its header. Bytes after the
// array are ignored, as np.load ignores them. Errors, including those of
// Read, start with the file name; an empty file is an ErrFormat error, not
// io.EOF. The caller must Close the ReadCloser.
func Open(name string) (*ReadCloser, error) {
	return array.Open(name, func(r io.Reader) (*Reader, error) {
		rd, err := NewReader(r)
		if err == io.EOF {
			err = readError("reading magic string", err)
		}
		return rd, err
	})
}

// readError wraps an error met while doing what: truncation is a format
// error, anything else an error of the underlying reader, wrapped as is.
func readError(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %s: %w", ErrFormat, what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("npy: %s: %w", what, err)
}
