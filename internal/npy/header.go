package npy

import (
	"fmt"
	"strings"
)

// parseHeader parses the dict literal of a .npy header and returns the
// header and the byte-swap width of its data (see parseDescr).
//
// The dict must have exactly the keys 'descr', 'fortran_order' and 'shape',
// as NumPy requires. Fortran order is accepted only where it is the same
// layout as C order: when at most one dimension exceeds 1.
func parseHeader(text string) (Header, int, error) {
	dict, err := parseLiteral(text)
	if err != nil {
		return Header{}, 0, err
	}
	if dict.kind != kindDict {
		return Header{}, 0, fmt.Errorf("%w: header %s is not a dict", ErrFormat, abbrev(dict.src))
	}
	var descr, fortran, shape *literal
	for i := 0; i < len(dict.elems); i += 2 {
		key, val := dict.elems[i], &dict.elems[i+1]
		var dst **literal
		switch {
		case key.kind == kindStr && key.str == "descr":
			dst = &descr
		case key.kind == kindStr && key.str == "fortran_order":
			dst = &fortran
		case key.kind == kindStr && key.str == "shape":
			dst = &shape
		default:
			return Header{}, 0, fmt.Errorf("%w: header has unexpected key %s", ErrFormat, abbrev(key.src))
		}
		if *dst != nil {
			return Header{}, 0, fmt.Errorf("%w: header has key %s twice", ErrFormat, key.src)
		}
		*dst = val
	}
	for _, k := range []struct {
		name string
		val  *literal
	}{{"descr", descr}, {"fortran_order", fortran}, {"shape", shape}} {
		if k.val == nil {
			return Header{}, 0, fmt.Errorf("%w: header has no key '%s'", ErrFormat, k.name)
		}
	}

	if fortran.kind != kindBool {
		return Header{}, 0, fmt.Errorf("%w: 'fortran_order' is %s, want True or False", ErrFormat, abbrev(fortran.src))
	}
	if shape.kind != kindTuple || len(shape.elems) > MaxDims {
		return Header{}, 0, fmt.Errorf("%w: 'shape' is %s, want a tuple of at most %d integers", ErrFormat, abbrev(shape.src), MaxDims)
	}
	dims := make([]int, len(shape.elems))
	big := 0 // dimensions greater than 1
	for i, e := range shape.elems {
		if e.kind != kindInt {
			return Header{}, 0, fmt.Errorf("%w: 'shape' %s has a non-integer dimension %s", ErrFormat, abbrev(shape.src), abbrev(e.src))
		}
		dims[i] = e.num
		if e.num > 1 {
			big++
		}
	}

	if descr.kind != kindStr {
		return Header{}, 0, fmt.Errorf("%w: structured dtype %s", ErrUnsupported, abbrev(descr.src))
	}
	dtype, width, err := parseDescr(descr.str)
	if err != nil {
		return Header{}, 0, err
	}
	if fortran.bool && big > 1 {
		return Header{}, 0, fmt.Errorf("%w: array of shape %v in Fortran order", ErrUnsupported, dims)
	}
	h := Header{DType: dtype, Shape: dims}
	if h.NumBytes() < 0 {
		return Header{}, 0, fmt.Errorf("%w: %s shape %v overflows int64 bytes", ErrFormat, dtype, dims)
	}
	return h, width, nil
}

// abbrev shortens source text quoted in error messages.
func abbrev(src string) string {
	const limit = 80
	if len(src) <= limit {
		return src
	}
	return strings.ToValidUTF8(src[:limit-3], "") + "..."
}
