package collective

import (
	"fmt"
	"unsafe"

	"github.com/tensorwire/tensorwire/memmap"
)

// Op is a reduction: what Allreduce, Reduce and ReduceScatter combine the
// ranks' elements with. Elements are combined in rank order (rank 0's
// first) wherever the algorithm allows, so every rank gets the same bits.
type Op uint8

// The reductions, after MPI's. Sum, Prod, Min and Max take every numeric
// dtype but float16, bfloat16 and the complex ones; the logical ones
// (LAnd, LOr, LXor: nonzero is true, the result is 0 or 1) take the
// integer dtypes and bool; the bitwise ones (BAnd, BOr, BXor) the integer
// dtypes and bool. Only Sum has an adjoint.
const (
	Sum Op = iota + 1
	Prod
	Min
	Max
	LAnd
	LOr
	LXor
	BAnd
	BOr
	BXor
	numOps
)

var opNames = [numOps]string{"invalid", "Sum", "Prod", "Min", "Max", "LAnd", "LOr", "LXor", "BAnd", "BOr", "BXor"}

// String returns the operation's name, such as "Sum".
func (o Op) String() string {
	if o == 0 || o >= numOps {
		return fmt.Sprintf("Op(%d)", uint8(o))
	}
	return opNames[o]
}

// Valid reports whether o is one of the operations above.
func (o Op) Valid() bool { return o >= Sum && o < numOps }

// Supports reports whether o can reduce elements of dtype dt.
func (o Op) Supports(dt memmap.DType) bool {
	switch o {
	case Sum, Prod, Min, Max:
		return arithmetic(dt)
	case LAnd, LOr, LXor, BAnd, BOr, BXor:
		return integer(dt) || dt == memmap.Bool
	}
	return false
}

// arithmetic reports whether dt's elements are numbers the package adds.
func arithmetic(dt memmap.DType) bool {
	return integer(dt) || dt == memmap.Float32 || dt == memmap.Float64
}

func integer(dt memmap.DType) bool {
	switch dt {
	case memmap.Uint8, memmap.Int8, memmap.Int16, memmap.Int32, memmap.Int64,
		memmap.Uint16, memmap.Uint32, memmap.Uint64:
		return true
	}
	return false
}

// Supported reports whether the package moves tensors of dtype dt at all:
// every dtype but complex ones (which no reduction takes) can be
// broadcast, gathered, scattered and sent.
func Supported(dt memmap.DType) bool { return dt.Valid() }

type numeric interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64
}

type integral interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

// as returns b as a []T (b's length must be a multiple of T's size).
func as[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// reduceN sets dst to srcs[0] op srcs[1] op ... in that order; every slice
// has dst's length, and dst may be one of srcs (then it must be srcs[0] if
// the order is to be rank order). op must support dt (checked before).
func reduceN(op Op, dt memmap.DType, dst []byte, srcs [][]byte) {
	switch dt {
	case memmap.Float32:
		reduceT[float32](op, dst, srcs)
	case memmap.Float64:
		reduceT[float64](op, dst, srcs)
	case memmap.Int8:
		reduceI[int8](op, dst, srcs)
	case memmap.Int16:
		reduceI[int16](op, dst, srcs)
	case memmap.Int32:
		reduceI[int32](op, dst, srcs)
	case memmap.Int64:
		reduceI[int64](op, dst, srcs)
	case memmap.Uint8, memmap.Bool:
		reduceI[uint8](op, dst, srcs)
	case memmap.Uint16:
		reduceI[uint16](op, dst, srcs)
	case memmap.Uint32:
		reduceI[uint32](op, dst, srcs)
	case memmap.Uint64:
		reduceI[uint64](op, dst, srcs)
	default:
		panic("collective: reduceN of " + dt.String())
	}
}

func typed[T any](dst []byte, srcs [][]byte) ([]T, [][]T) {
	d := as[T](dst)
	s := make([][]T, len(srcs))
	for i, b := range srcs {
		s[i] = as[T](b)[:len(d)]
	}
	return d, s
}

func reduceT[T numeric](op Op, dst []byte, srcs [][]byte) {
	d, s := typed[T](dst, srcs)
	switch op {
	case Sum:
		sumN(d, s)
	case Prod:
		fold(d, s, func(a, b T) T { return a * b })
	case Min:
		fold(d, s, func(a, b T) T {
			if b < a || b != b { // NaN wins, as torch's min
				return b
			}
			return a
		})
	case Max:
		fold(d, s, func(a, b T) T {
			if b > a || b != b {
				return b
			}
			return a
		})
	default:
		panic("collective: " + op.String() + " on a float")
	}
}

func reduceI[T integral](op Op, dst []byte, srcs [][]byte) {
	d, s := typed[T](dst, srcs)
	b2i := func(v bool) T {
		if v {
			return 1
		}
		return 0
	}
	switch op {
	case Sum, Prod, Min, Max:
		reduceT[T](op, dst, srcs)
	case LAnd:
		fold(d, s, func(a, b T) T { return b2i(a != 0 && b != 0) })
	case LOr:
		fold(d, s, func(a, b T) T { return b2i(a != 0 || b != 0) })
	case LXor:
		fold(d, s, func(a, b T) T { return b2i((a != 0) != (b != 0)) })
	case BAnd:
		fold(d, s, func(a, b T) T { return a & b })
	case BOr:
		fold(d, s, func(a, b T) T { return a | b })
	case BXor:
		fold(d, s, func(a, b T) T { return a ^ b })
	}
}

// fold sets d to s[0] f s[1] f ... (left to right).
func fold[T any](d []T, s [][]T, f func(a, b T) T) {
	if len(s) == 1 {
		copy(d, s[0])
		return
	}
	a, b := s[0], s[1]
	for i := range d {
		d[i] = f(a[i], b[i])
	}
	for _, x := range s[2:] {
		for i := range d {
			d[i] = f(d[i], x[i])
		}
	}
}

// sumN sets d to s[0] + s[1] + ... left to right, four sources a pass (the
// sum is memory-bound: fewer passes over d, less traffic).
func sumN[T numeric](d []T, s [][]T) {
	switch len(s) {
	case 1:
		copy(d, s[0])
		return
	case 2:
		sum2(d, s[0], s[1])
		return
	case 3:
		sum3(d, s[0], s[1], s[2])
		return
	}
	sum4(d, s[0], s[1], s[2], s[3])
	for rest := s[4:]; len(rest) > 0; {
		switch len(rest) {
		case 1:
			sum2(d, d, rest[0])
			rest = rest[1:]
		case 2:
			sum3(d, d, rest[0], rest[1])
			rest = rest[2:]
		default:
			sum4(d, d, rest[0], rest[1], rest[2])
			rest = rest[3:]
		}
	}
}

func sum2[T numeric](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for i := range d {
		d[i] = a[i] + b[i]
	}
}

func sum3[T numeric](d, a, b, c []T) {
	a, b, c = a[:len(d)], b[:len(d)], c[:len(d)]
	for i := range d {
		d[i] = a[i] + b[i] + c[i]
	}
}

func sum4[T numeric](d, a, b, c, e []T) {
	a, b, c, e = a[:len(d)], b[:len(d)], c[:len(d)], e[:len(d)]
	for i := range d {
		d[i] = a[i] + b[i] + c[i] + e[i]
	}
}
