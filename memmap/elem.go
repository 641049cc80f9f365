package memmap

import (
	"encoding/binary"
	"math"

	"github.com/x448/float16"
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
		le.PutUint16(b, float16.Fromfloat32(float32(v)).Bits())
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
		return float64(float16.Frombits(le.Uint16(b)).Float32())
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
