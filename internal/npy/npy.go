// Package npy reads and writes NumPy .npy files, streaming the data as
// little-endian, C-order bytes.
//
// A .npy file is a preamble followed by the raw array data:
//
//	"\x93NUMPY" <major> <minor>   magic string and format version
//	<header length>               uint16 LE in version 1.0, uint32 LE in 2.0 and 3.0
//	<header>                      a Python dict literal, space-padded, ending in '\n'
//	<data>                        the elements, in C or Fortran order
//
// The header is a dict such as
//
//	{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
//
// where descr is the dtype as NumPy's dtype.str spells it. This package
// parses the header with a small strict parser for Python literals (it never
// evaluates anything) and supports the numeric and boolean dtypes of either
// byte order: '|b1', '|u1', '|i1' and the '<', '>' or '=' forms of 'i2',
// 'i4', 'i8', 'u2', 'u4', 'u8', 'f2', 'f4', 'f8', 'c8' and 'c16'.
// Structured, string, object and datetime dtypes are reported as
// ErrUnsupported, as are Fortran-order arrays whose layout differs from
// C order.
package npy

import (
	"errors"

	"github.com/tensorwire/tensorwire/internal/array"
)

var (
	// ErrFormat is wrapped by every error reporting input that is not a
	// well-formed .npy file: a bad magic string, a header that does not
	// parse or lacks a key, a size that overflows int64, or data shorter
	// than the header says. Errors for truncated input also wrap
	// io.ErrUnexpectedEOF.
	ErrFormat = errors.New("npy: malformed file")

	// ErrUnsupported is wrapped by errors reporting a well-formed file this
	// package cannot represent: an unknown format version, a dtype without
	// a memmap.DType counterpart (the message quotes its descr), or an
	// array in Fortran order.
	ErrUnsupported = errors.New("npy: unsupported")
)

// MaxDims is the largest number of dimensions accepted, NumPy's own limit.
const MaxDims = 64

// maxHeaderLen bounds the header length field. NumPy refuses headers over
// 10000 bytes by default; this limit is looser, and the header is read
// incrementally so a false claim costs no memory.
const maxHeaderLen = 1 << 20

// Header describes the array stored in a .npy file; its Shape is empty for
// a scalar.
type Header = array.Header
