package npy

import (
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/tensorwire/tensorwire/memmap"
)

// WriteHeader writes the preamble and header of a .npy file holding a
// C-order, little-endian array of h.DType and h.Shape; the caller writes
// the h.NumBytes() bytes of data after it. The output is byte for byte what
// np.save writes: format version 1.0 and a header padded so that the data
// starts at a multiple of 64 bytes, with room for the first dimension to
// grow to 21 digits in place.
//
// An invalid dtype or shape is an error wrapping memmap.ErrDType or
// memmap.ErrShape; a dtype NumPy lacks (bfloat16) wraps ErrUnsupported.
func WriteHeader(w io.Writer, h Header) error {
	descr, err := descrOf(h.DType)
	if err != nil {
		return err
	}
	if h.NumBytes() < 0 || len(h.Shape) > MaxDims {
		return fmt.Errorf("npy: %w: %v of %v", memmap.ErrShape, h.Shape, h.DType)
	}
	var b strings.Builder
	b.WriteString("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (")
	for i, d := range h.Shape {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(d))
	}
	if len(h.Shape) == 1 {
		b.WriteByte(',')
	}
	b.WriteString("), }")
	if len(h.Shape) > 0 {
		const growthDigits = 21 // NumPy's GROWTH_AXIS_MAX_DIGITS
		b.WriteString(strings.Repeat(" ", max(0, growthDigits-len(strconv.Itoa(h.Shape[0])))))
	}
	_, err = w.Write(preamble(b.String()))
	if err != nil {
		return fmt.Errorf("npy: writing header: %w", err)
	}
	return nil
}

// preamble returns the magic string, version 1.0, header length and
// header, padded with spaces and a newline so its length is a multiple of
// 64, as NumPy's _wrap_header does. NumPy switches to version 2.0 for
// headers over 64 KiB, but with at most MaxDims dimensions of 19 digits a
// header of a supported dtype stays under 2 KiB.
func preamble(header string) []byte {
	const align = 64
	hlen := len(header) + 1 // with the newline
	pad := align - (len(magic)+4+hlen)%align
	b := append([]byte(magic), 1, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(hlen+pad))
	b = append(b, header...)
	b = append(b, strings.Repeat(" ", pad)...)
	return append(b, '\n')
}
