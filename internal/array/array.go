// Package array is what the decoders of array file formats (internal/idx,
// internal/npy) share: a Header naming the dtype and shape, a Reader that
// yields the header and then the data as little-endian C-order bytes, and a
// File that does so for a named file, with the name in its errors.
package array

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/tensorwire/tensorwire/memmap"
)

// Header describes a decoded array.
type Header struct {
	DType memmap.DType // element type
	Shape []int        // dimensions, outermost first; empty for a scalar
}

// NumBytes returns the size in bytes of the data the header describes, by
// the rules of memmap.NumBytes (1 element for a scalar, 0 if any dimension
// is 0). It returns -1 if a dimension is negative, the dtype is invalid, or
// the size overflows. Decoders never return a Header for which it is -1.
func (h Header) NumBytes() int64 {
	n, err := memmap.NumBytes(h.DType, h.Shape)
	if err != nil {
		return -1
	}
	return int64(n)
}

// Reader is a decoded array: its header, then its data.
type Reader struct {
	hdr  Header
	data io.Reader
}

// NewReader returns a Reader of header h whose Read reads data, which must
// yield exactly h.NumBytes() little-endian bytes and then io.EOF. Decoders
// build it after parsing their format's header.
func NewReader(h Header, data io.Reader) *Reader {
	return &Reader{hdr: h, data: data}
}

// Header returns the array's header. The Shape is a copy the caller may
// modify.
func (r *Reader) Header() Header {
	return Header{DType: r.hdr.DType, Shape: slices.Clone(r.hdr.Shape)}
}

// Read reads up to len(p) bytes of the data, in C order, each element
// little-endian. Elements may be split across calls. How the end of the data
// and truncation are reported is the decoder's (see its NewReader).
func (r *Reader) Read(p []byte) (int, error) { return r.data.Read(p) }

// File is a Reader for a file opened by Open.
type File struct {
	*Reader
	name string
	f    *os.File
}

// Open opens the named file and decodes its header with decode, which reads
// from a buffered reader of the file. Errors from decode, and from Read
// other than io.EOF, are prefixed with the file name. The caller must Close
// the File.
func Open(name string, decode func(io.Reader) (*Reader, error)) (*File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	r, err := decode(bufio.NewReader(f))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &File{Reader: r, name: name, f: f}, nil
}

// Read is Reader.Read with the file name added to errors other than io.EOF.
func (f *File) Read(p []byte) (int, error) {
	n, err := f.Reader.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%s: %w", f.name, err)
	}
	return n, err
}

// Close closes the file.
func (f *File) Close() error { return f.f.Close() }
