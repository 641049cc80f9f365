package memmap

import (
	"encoding/binary"
	"math"
)

// PutFloat64 stores v into b (at least Size() bytes) as one element of dtype
// d, converting as a cast in torch would: integers truncate toward zero and
// wrap, bool is v != 0, float16 and bfloat16 round to nearest even, complex
// dtypes get v as their real part. It does nothing for an invalid dtype.
func (d DType) PutFloat64(b []byte, v float64) {
	le := binary.LittleEndian
	switch d {
	case Bool:
		b[0] = 0
		if v != 0 {
			b[0] = 1
		}
	case Uint8:
		b[0] = uint8(int64(v))
	case Int8:
		b[0] = uint8(int8(int64(v)))
	case Int16, Uint16:
		le.PutUint16(b, uint16(int64(v)))
	case Int32, Uint32:
		le.PutUint32(b, uint32(int64(v)))
	case Int64:
		le.PutUint64(b, uint64(int64(v)))
	case Uint64:
		le.PutUint64(b, uint64(v))
	case Float16:
		le.PutUint16(b, float32ToHalf(float32(v)))
	case BFloat16:
		le.PutUint16(b, float32ToBFloat(float32(v)))
	case Float32:
		le.PutUint32(b, math.Float32bits(float32(v)))
	case Float64:
		le.PutUint64(b, math.Float64bits(v))
	case Complex64:
		le.PutUint32(b, math.Float32bits(float32(v)))
		le.PutUint32(b[4:], 0)
	case Complex128:
		le.PutUint64(b, math.Float64bits(v))
		le.PutUint64(b[8:], 0)
	}
}

// Float64 returns the element of dtype d stored at the start of b as a
// float64: exact for every dtype but int64 and uint64 beyond 2^53, the real
// part for complex dtypes, NaN for an invalid dtype.
func (d DType) Float64(b []byte) float64 {
	le := binary.LittleEndian
	switch d {
	case Bool, Uint8:
		return float64(b[0])
	case Int8:
		return float64(int8(b[0]))
	case Int16:
		return float64(int16(le.Uint16(b)))
	case Uint16:
		return float64(le.Uint16(b))
	case Int32:
		return float64(int32(le.Uint32(b)))
	case Uint32:
		return float64(le.Uint32(b))
	case Int64:
		return float64(int64(le.Uint64(b)))
	case Uint64:
		return float64(le.Uint64(b))
	case Float16:
		return float64(halfToFloat32(le.Uint16(b)))
	case BFloat16:
		return float64(math.Float32frombits(uint32(le.Uint16(b)) << 16))
	case Float32, Complex64:
		return float64(math.Float32frombits(le.Uint32(b)))
	case Float64, Complex128:
		return math.Float64frombits(le.Uint64(b))
	}
	return math.NaN()
}

// float32ToBFloat rounds f to bfloat16 (the top half of its bits), to nearest
// even, keeping NaNs NaN.
func float32ToBFloat(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40 // quiet NaN
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// float32ToHalf rounds f to IEEE 754 binary16, to nearest even, with
// overflow to infinity and gradual underflow to subnormals and zero.
func float32ToHalf(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int(u>>23&0xff) - 127 + 15
	mant := u & 0x7fffff
	switch {
	case u&0x7fffffff > 0x7f800000: // NaN
		return sign | 0x7e00
	case u&0x7fffffff == 0x7f800000: // Inf
		return sign | 0x7c00
	case exp >= 0x1f: // too large: Inf
		return sign | 0x7c00
	case exp <= 0: // subnormal or zero
		if exp < -10 {
			return sign
		}
		mant |= 0x800000 // implicit leading 1
		shift := uint(14 - exp)
		half := uint32(1) << (shift - 1)
		r := mant >> shift
		rem := mant & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(exp)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to Inf: still correct
	}
	return sign | uint16(r)
}

// halfToFloat32 converts IEEE 754 binary16 bits to float32, exactly.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
