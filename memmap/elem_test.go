package memmap

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/x448/float16"
)

func TestDType_Float64RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		d    DType
		in   float64
		want float64
	}{
		{Bool, 3, 1}, {Bool, 0, 0},
		{Uint8, 255, 255}, {Uint8, 256, 0}, {Int8, -128, -128}, {Int8, 3.9, 3},
		{Int16, -300, -300}, {Uint16, 65535, 65535}, {Int32, -7, -7}, {Uint32, 4e9, 4e9},
		{Int64, -1 << 40, -1 << 40}, {Uint64, 1 << 60, 1 << 60},
		{Float16, 1, 1}, {Float16, -2.5, -2.5}, {Float16, 65504, 65504}, {Float16, 1e6, math.Inf(1)},
		{Float16, 1.0 / (1 << 24), 1.0 / (1 << 24)}, // smallest subnormal
		{Float16, 1.0 / (1 << 26), 0},               // underflows
		{Float16, 1 + 1.0/2048, 1},                  // halfway: rounds to even
		{Float16, 1 + 3.0/2048, 1 + 2.0/1024},       // halfway: rounds to even (up)
		{BFloat16, 1, 1}, {BFloat16, -3, -3}, {BFloat16, 1 + 1.0/256, 1}, {BFloat16, 1 + 3.0/256, 1 + 2.0/128},
		{Float32, 0.1, float64(float32(0.1))}, {Float64, 0.1, 0.1},
		{Complex64, 2.5, 2.5}, {Complex128, -1.25, -1.25},
	} {
		b := make([]byte, 16)
		tc.d.PutFloat64(b, tc.in)
		if got := tc.d.Float64(b); got != tc.want {
			t.Errorf("%v: put %v, got back %v, want %v", tc.d, tc.in, got, tc.want)
		}
	}
}

// putHalf and getHalf convert through the DType methods, as callers do.
func putHalf(v float64) uint16 {
	b := make([]byte, 2)
	Float16.PutFloat64(b, v)
	return binary.LittleEndian.Uint16(b)
}

func getHalf(h uint16) float64 {
	return Float16.Float64(binary.LittleEndian.AppendUint16(nil, h))
}

func TestDType_HalfBits(t *testing.T) {
	for _, tc := range []struct {
		f    float64
		half uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff}, {math.Inf(-1), 0xfc00},
		{6.103515625e-05, 0x0400}, {5.960464477539063e-08, 0x0001},
		{math.NaN(), 0x7e00}, // the NaN torch writes
	} {
		if got := putHalf(tc.f); got != tc.half {
			t.Errorf("PutFloat64(%v) = %#04x, want %#04x", tc.f, got, tc.half)
		}
		if got := getHalf(tc.half); got != tc.f && !(math.IsNaN(got) && math.IsNaN(tc.f)) {
			t.Errorf("Float64(%#04x) = %v, want %v", tc.half, got, tc.f)
		}
	}
}

// TestDType_HalfMatchesLibrary compares the Float16 conversions, as callers
// reach them, with github.com/x448/float16 over all 65536 halfs: each half
// reads as the library's value and writes back to itself, and the midpoint
// between two neighbouring finite halfs, and the float32s on either side of
// it, round as the library rounds (ties to the even half).
func TestDType_HalfMatchesLibrary(t *testing.T) {
	for h := range uint32(0x10000) {
		want := float16.Frombits(uint16(h)).Float32()
		got := getHalf(uint16(h))
		if math.IsNaN(float64(want)) {
			if !math.IsNaN(got) {
				t.Fatalf("Float64(%#04x) = %v, want NaN", h, got)
			}
			if back := putHalf(got); !float16.Frombits(back).IsNaN() {
				t.Fatalf("NaN %#04x wrote back as %#04x", h, back)
			}
			continue
		}
		if got != float64(want) || math.Signbit(got) != math.Signbit(float64(want)) {
			t.Fatalf("Float64(%#04x) = %v, library says %v", h, got, want)
		}
		if back := putHalf(got); back != uint16(h) {
			t.Fatalf("half %#04x wrote back as %#04x", h, back)
		}
		next := float16.Frombits(uint16(h + 1))
		if h&0x7fff >= 0x7bff || !next.IsFinite() || next.Signbit() != (h&0x8000 != 0) {
			continue // no finite neighbour above (in magnitude)
		}
		mid := (want + next.Float32()) / 2 // exact: halfs have 11 significant bits
		if (h & 1) != 0 {
			if putHalf(float64(mid)) != uint16(h+1) {
				t.Fatalf("midpoint %v of %#04x and %#04x rounds to %#04x, want the even %#04x", mid, h, h+1, putHalf(float64(mid)), h+1)
			}
		} else if putHalf(float64(mid)) != uint16(h) {
			t.Fatalf("midpoint %v of %#04x and %#04x rounds to %#04x, want the even %#04x", mid, h, h+1, putHalf(float64(mid)), h)
		}
		for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))), math.Nextafter32(mid, float32(math.Inf(-1)))} {
			if got, want := putHalf(float64(f)), float16.Fromfloat32(f).Bits(); got != want {
				t.Fatalf("PutFloat64(%v) = %#04x, library says %#04x", f, got, want)
			}
		}
	}
}

func TestNumBytes(t *testing.T) {
	for _, tc := range []struct {
		dt    DType
		shape []int
		want  int
		ok    bool
	}{
		{Float32, []int{2, 3}, 24, true},
		{Complex128, nil, 16, true},
		{Int64, []int{math.MaxInt, math.MaxInt, 0}, 0, true},
		{Uint8, []int{2, -1}, 0, false},
		{Uint8, []int{0, -1}, 0, false},
		{Int16, []int{1 << 62}, 0, false},
		{Invalid, []int{1}, 0, false},
	} {
		got, err := NumBytes(tc.dt, tc.shape)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("NumBytes(%v, %v) = %d, %v; want %d, ok=%v", tc.dt, tc.shape, got, err, tc.want, tc.ok)
		}
	}
}
