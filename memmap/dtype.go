package memmap

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor, named as PyTorch names it. The zero
// value is Invalid.
//
// Every DType has a fixed item size and a little-endian, C-order layout on disk.
// Float16 and BFloat16 elements are raw 2-byte values; PutFloat64 and Float64
// convert them.
type DType uint8

// The supported dtypes. The numeric values are not part of any format: files
// store the name returned by String.
const (
	Invalid DType = iota
	Bool
	Uint8
	Int8
	Int16
	Int32
	Int64
	Uint16
	Uint32
	Uint64
	Float16
	BFloat16
	Float32
	Float64
	Complex64
	Complex128
	numDTypes
)

var dtypeInfo = [numDTypes]struct {
	name string // torch name without the "torch." prefix
	size int
	real bool  // elements are real numbers (not complex)
	bits DType // no Go or NumPy type holds an element: read and viewed as these raw bits
}{
	Invalid:    {"invalid", 0, false, Invalid},
	Bool:       {"bool", 1, true, Invalid},
	Uint8:      {"uint8", 1, true, Invalid},
	Int8:       {"int8", 1, true, Invalid},
	Int16:      {"int16", 2, true, Invalid},
	Int32:      {"int32", 4, true, Invalid},
	Int64:      {"int64", 8, true, Invalid},
	Uint16:     {"uint16", 2, true, Invalid},
	Uint32:     {"uint32", 4, true, Invalid},
	Uint64:     {"uint64", 8, true, Invalid},
	Float16:    {"float16", 2, true, Uint16},
	BFloat16:   {"bfloat16", 2, true, Uint16},
	Float32:    {"float32", 4, true, Invalid},
	Float64:    {"float64", 8, true, Invalid},
	Complex64:  {"complex64", 8, false, Invalid},
	Complex128: {"complex128", 16, false, Invalid},
}

// aliases maps other spellings torch and NumPy use to a DType.
var aliases = map[string]DType{
	"float": Float32, "double": Float64, "half": Float16, "long": Int64,
	"int": Int32, "short": Int16, "cfloat": Complex64, "cdouble": Complex128,
}

// String returns the dtype as str(torch.dtype) spells it, e.g. "torch.float32".
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("memmap.DType(%d)", uint8(d))
	}
	return "torch." + dtypeInfo[d].name
}

// Name returns the dtype name without the "torch." prefix, e.g. "float32".
func (d DType) Name() string {
	if !d.Valid() {
		return d.String()
	}
	return dtypeInfo[d].name
}

// Valid reports whether d is one of the supported dtypes.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

// Size returns the size of one element in bytes, or 0 for an invalid dtype.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// Real reports whether the elements are real numbers that convert to float64
// (every dtype but the complex ones).
func (d DType) Real() bool { return d.Valid() && dtypeInfo[d].real }

// Bits returns the unsigned dtype whose values are d's raw bits when no Go
// or NumPy type holds d's elements (Float16 and BFloat16: Uint16), and d
// itself otherwise. Element access by Go type (tensordict.Values, the Dense
// views) and the Python client's numpy arrays go through it; a new dtype
// of that kind (float8, say) is one row of the dtype table.
func (d DType) Bits() DType {
	if d.Valid() && dtypeInfo[d].bits != Invalid {
		return dtypeInfo[d].bits
	}
	return d
}

// ParseDType parses a dtype name as torch prints it ("torch.float32") or
// without the prefix ("float32"), including torch's aliases such as "float"
// and "long". An unknown name returns an error wrapping ErrDType.
func ParseDType(name string) (DType, error) {
	n := strings.TrimPrefix(name, "torch.")
	for d := Bool; d < numDTypes; d++ {
		if dtypeInfo[d].name == n {
			return d, nil
		}
	}
	if d, ok := aliases[n]; ok {
		return d, nil
	}
	return Invalid, fmt.Errorf("%w: %q", ErrDType, name)
}

// MarshalText returns the name String returns, e.g. "torch.float32": the
// name meta.json, replay.json and the rpc wire carry (the numeric values
// are not part of any format). An invalid dtype has no name: it returns an
// error wrapping ErrDType, so a zero DType never reaches a file.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("%w: %v has no name", ErrDType, d)
	}
	return []byte(d.String()), nil
}

// UnmarshalText sets d to the dtype named by text, as ParseDType reads it
// (so "torch.float32", "float32" and torch's aliases such as "float"). An
// unknown name returns an error wrapping ErrDType and leaves d unchanged.
func (d *DType) UnmarshalText(text []byte) error {
	dt, err := ParseDType(string(text))
	if err != nil {
		return err
	}
	*d = dt
	return nil
}

// MarshalBinary returns the same bytes as MarshalText: binary encoders
// (gob, msgpack) carry the name too, never the numeric value.
func (d DType) MarshalBinary() ([]byte, error) { return d.MarshalText() }

// UnmarshalBinary reads what MarshalBinary writes, as UnmarshalText.
func (d *DType) UnmarshalBinary(data []byte) error { return d.UnmarshalText(data) }
