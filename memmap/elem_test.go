package memmap

import (
	"math"
	"testing"
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

func TestDType_HalfBits(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		half uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff}, {float32(math.Inf(-1)), 0xfc00},
		{6.103515625e-05, 0x0400}, {5.960464477539063e-08, 0x0001},
	} {
		if got := float32ToHalf(tc.f); got != tc.half {
			t.Errorf("float32ToHalf(%v) = %#04x, want %#04x", tc.f, got, tc.half)
		}
		if got := halfToFloat32(tc.half); got != tc.f {
			t.Errorf("halfToFloat32(%#04x) = %v, want %v", tc.half, got, tc.f)
		}
	}
	if got := halfToFloat32(float32ToHalf(float32(math.NaN()))); !math.IsNaN(float64(got)) {
		t.Errorf("NaN round trip gave %v", got)
	}
	// Every finite half survives half -> float32 -> half.
	for h := range uint32(0x10000) {
		if h&0x7c00 == 0x7c00 {
			continue
		}
		if got := float32ToHalf(halfToFloat32(uint16(h))); got != uint16(h) {
			t.Fatalf("half %#04x round trip gave %#04x", h, got)
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
