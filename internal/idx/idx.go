// Package idx decodes the IDX files of MNIST and Fashion-MNIST into
// little-endian, C-order tensor data, one chunk at a time.
//
// An IDX file is a 4-byte magic number, the dimensions, and the data:
//
//	0x00 0x00 <type> <ndims>       magic: two zero bytes, element type, rank
//	<dim 0> ... <dim ndims-1>      each a big-endian uint32
//	<data>                         elements in C order, big-endian
//
// The type byte is one of 0x08 (uint8), 0x09 (int8), 0x0B (int16),
// 0x0C (int32), 0x0D (float32) and 0x0E (float64). Files are often
// distributed gzip-compressed; NewReader decompresses them transparently.
package idx

import (
	"errors"

	"github.com/tensorwire/tensorwire/internal/array"
	"github.com/tensorwire/tensorwire/memmap"
)

// ErrFormat is wrapped by every error that reports input which is not a
// well-formed IDX file: a bad magic number, an unknown type byte, a rank of 0
// or above MaxDims, a size that overflows int64, data shorter or longer than
// the header says, or a corrupt gzip stream. Errors for truncated input also
// wrap io.ErrUnexpectedEOF.
var ErrFormat = errors.New("idx: malformed file")

// MaxDims is the largest rank NewReader accepts. The format allows 255, but
// no real dataset comes close and a small bound keeps hostile headers cheap.
const MaxDims = 16

// Header describes the tensor stored in an IDX file; its Shape is never
// empty.
type Header = array.Header

// dtypes maps IDX type bytes to dtypes.
var dtypes = map[byte]memmap.DType{
	0x08: memmap.Uint8,
	0x09: memmap.Int8,
	0x0B: memmap.Int16,
	0x0C: memmap.Int32,
	0x0D: memmap.Float32,
	0x0E: memmap.Float64,
}
