package npy

import (
	"fmt"
	"strings"

	"github.com/tensorwire/tensorwire/memmap"
)

// codes lists the supported dtypes with their NumPy type codes: the descr
// without its byte-order character.
var codes = []struct {
	dtype memmap.DType
	code  string
}{
	{memmap.Bool, "b1"},
	{memmap.Uint8, "u1"},
	{memmap.Int8, "i1"},
	{memmap.Int16, "i2"},
	{memmap.Int32, "i4"},
	{memmap.Int64, "i8"},
	{memmap.Uint16, "u2"},
	{memmap.Uint32, "u4"},
	{memmap.Uint64, "u8"},
	{memmap.Float16, "f2"},
	{memmap.Float32, "f4"},
	{memmap.Float64, "f8"},
	{memmap.Complex64, "c8"},
	{memmap.Complex128, "c16"},
}

// parseDescr returns the dtype of a descr string such as "<f4", and the
// width of the words to byte-swap to make its data little-endian: 1 for
// little-endian data and single bytes, the item size for big-endian reals,
// and half of it for big-endian complex numbers, which are pairs of reals.
//
// The byte order is '<' (little-endian), '>' (big-endian), '=' (native) or
// '|' (not applicable); '=' and '|' are read as little-endian, the byte
// order of every platform tensorwire supports.
func parseDescr(descr string) (memmap.DType, int, error) {
	if len(descr) > 1 && strings.IndexByte("<>=|", descr[0]) >= 0 {
		bigEndian, code := descr[0] == '>', descr[1:]
		for _, c := range codes {
			if c.code != code {
				continue
			}
			switch size := c.dtype.Size(); {
			case !bigEndian || size == 1:
				return c.dtype, 1, nil
			case c.dtype.Real():
				return c.dtype, size, nil
			default:
				return c.dtype, size / 2, nil
			}
		}
	}
	return memmap.Invalid, 0, fmt.Errorf("%w: dtype %q", ErrUnsupported, descr)
}

// descrOf returns the little-endian descr of d, as NumPy writes it.
func descrOf(d memmap.DType) (string, error) {
	if !d.Valid() {
		return "", fmt.Errorf("npy: %w: %v", memmap.ErrDType, d)
	}
	for _, c := range codes {
		if c.dtype == d {
			if d.Size() == 1 {
				return "|" + c.code, nil
			}
			return "<" + c.code, nil
		}
	}
	return "", fmt.Errorf("%w: %v has no NumPy dtype", ErrUnsupported, d)
}
