package main

import (
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/big"
	"math/bits"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// addStats sets f's min, max and sum of t's elements (t has at least one):
// exact integers for integer and bool dtypes, float64 for the others.
func addStats(f *field, t *tensordict.Tensor) error {
	if signed, unsigned := intDecoders(t.DType()); signed != nil || unsigned != nil {
		mn, mx, sum, err := intStats(t, signed, unsigned)
		if err != nil {
			return err
		}
		f.Min, f.Max, f.Sum = &num{i: mn}, &num{i: mx}, &num{i: sum}
		return nil
	}
	s, err := t.Stats()
	if err != nil {
		return err
	}
	f.Min, f.Max, f.Sum = &num{f: s.Min}, &num{f: s.Max}, &num{f: s.Sum}
	return nil
}

// intDecoders returns the decoder of one little-endian element of dt, as
// int64 for signed dtypes or uint64 for unsigned ones and bool; both nil
// for the other dtypes.
func intDecoders(dt memmap.DType) (signed func([]byte) int64, unsigned func([]byte) uint64) {
	le := binary.LittleEndian
	switch dt {
	case memmap.Int8:
		return func(b []byte) int64 { return int64(int8(b[0])) }, nil
	case memmap.Int16:
		return func(b []byte) int64 { return int64(int16(le.Uint16(b))) }, nil
	case memmap.Int32:
		return func(b []byte) int64 { return int64(int32(le.Uint32(b))) }, nil
	case memmap.Int64:
		return func(b []byte) int64 { return int64(le.Uint64(b)) }, nil
	case memmap.Bool:
		return nil, func(b []byte) uint64 {
			if b[0] != 0 {
				return 1
			}
			return 0
		}
	case memmap.Uint8:
		return nil, func(b []byte) uint64 { return uint64(b[0]) }
	case memmap.Uint16:
		return nil, func(b []byte) uint64 { return uint64(le.Uint16(b)) }
	case memmap.Uint32:
		return nil, func(b []byte) uint64 { return uint64(le.Uint32(b)) }
	case memmap.Uint64:
		return nil, le.Uint64
	}
	return nil, nil
}

// intStats reads t in chunks and returns the exact min, max and sum of its
// elements, decoded by signed or unsigned (one of them is set). The sum is
// kept in 128 bits, which no tensor's sum of 64-bit elements can overflow
// below 2^63 elements.
func intStats(t *tensordict.Tensor, signed func([]byte) int64, unsigned func([]byte) uint64) (mn, mx, sum *big.Int, err error) {
	size := t.DType().Size()
	buf := make([]byte, max(1, (1<<20)/size)*size)
	var (
		lo       uint64 // the sum's low 64 bits
		hi       int64  // its high 64 bits, two's complement
		smn, smx int64  = math.MaxInt64, math.MinInt64
		umn, umx uint64 = math.MaxUint64, 0
	)
	for off := int64(0); ; off += int64(len(buf)) {
		n, rerr := t.ReadAt(buf, off)
		b := buf[:n-n%size]
		var carry uint64
		for i := 0; i < len(b); i += size {
			if signed != nil {
				v := signed(b[i:])
				smn, smx = min(smn, v), max(smx, v)
				lo, carry = bits.Add64(lo, uint64(v), 0)
				hi += int64(carry)
				if v < 0 {
					hi-- // v sign-extended to 128 bits
				}
			} else {
				v := unsigned(b[i:])
				umn, umx = min(umn, v), max(umx, v)
				lo, carry = bits.Add64(lo, v, 0)
				hi += int64(carry)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return nil, nil, nil, rerr
		}
	}
	sum = new(big.Int).Lsh(big.NewInt(hi), 64)
	sum.Add(sum, new(big.Int).SetUint64(lo))
	if signed != nil {
		return big.NewInt(smn), big.NewInt(smx), sum, nil
	}
	return new(big.Int).SetUint64(umn), new(big.Int).SetUint64(umx), sum, nil
}
