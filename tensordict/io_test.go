package tensordict

import (
	"bytes"
	"errors"
	"io"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

func TestTensor_Stats(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name          string
		x             *Tensor
		min, max, sum float64
	}{
		{"int8", must[*Tensor](t)(FromSlice([]int8{-3, 5, 1})), -3, 5, 3},
		{"bool", must[*Tensor](t)(FromSlice([]bool{true, false, true})), 0, 1, 2},
		{"float16", must[*Tensor](t)(must[*Tensor](t)(FromSlice([]uint16{0x3c00, 0xc000})).WithDType(memmap.Float16)), -2, 1, -1},
		{"float32 with NaN", must[*Tensor](t)(FromSlice([]float32{1, nan, 2})), math.NaN(), math.NaN(), math.NaN()},
		// inf + -inf is NaN, but no element is: torch's min and max stay the infinities.
		{"both infinities", must[*Tensor](t)(FromSlice([]float64{math.Inf(1), -1, math.Inf(-1)})), math.Inf(-1), math.Inf(1), math.NaN()},
		{"empty", must[*Tensor](t)(Zeros(memmap.Float64, 0, 3)), math.NaN(), math.NaN(), math.NaN()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tc.x.Stats()
			if err != nil {
				t.Fatal(err)
			}
			same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
			if !same(s.Min, tc.min) || !same(s.Max, tc.max) || !same(s.Sum, tc.sum) || s.Count != tc.x.NumElements() {
				t.Errorf("stats %+v, want min %v max %v sum %v count %d", s, tc.min, tc.max, tc.sum, tc.x.NumElements())
			}
		})
	}
	if _, err := must[*Tensor](t)(Zeros(memmap.Complex64, 2)).Stats(); !errors.Is(err, memmap.ErrDType) {
		t.Errorf("stats of complex: err = %v, want ErrDType", err)
	}
}

// TestTensor_StatsOfMappedData covers the chunked path over several chunks.
func TestTensor_StatsOfMappedData(t *testing.T) {
	n := chunkSize/4 + 1000 // int32 elements: more than one chunk
	td := mustNew(t, n)
	td.Set("x", must[*Tensor](t)(Zeros(memmap.Int32, n)))
	m := must[*TensorDict](t)(td.Memmap(filepath.Join(t.TempDir(), "p")))
	defer m.Close()
	x := must[*Tensor](t)(m.Tensor("x"))
	x.Fill([]int{n - 1}, 7)
	x.Fill([]int{3}, -2)
	s, err := x.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.Min != -2 || s.Max != 7 || s.Sum != 5 || s.Count != n {
		t.Errorf("stats %+v", s)
	}
}

func TestTensor_ReadAtWriteAt(t *testing.T) {
	x := must[*Tensor](t)(Zeros(memmap.Uint8, 2, 3))
	ow := io.NewOffsetWriter(x, 2)
	if _, err := ow.Write([]byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := ow.Write([]byte{5}); !errors.Is(err, memmap.ErrIndex) {
		t.Errorf("write past the end: err = %v, want ErrIndex", err)
	}
	p := make([]byte, 4)
	if n, err := x.ReadAt(p, 3); n != 3 || err != io.EOF || p[0] != 2 || p[2] != 4 {
		t.Errorf("ReadAt = %d, %v, %v", n, err, p)
	}
}

func TestCreate_FromSchema(t *testing.T) {
	src := sample(t, 3)
	td, err := Create(filepath.Join(t.TempDir(), "p"), src.BatchSize(), src.Schema()...)
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	if err := td.SetSlice(0, must[*TensorDict](t)(src.Gather([]int{2, 1, 0}))); err != nil {
		t.Fatal(err)
	}
	if got := values[int64](t, td, "action"); got[0] != 20 || got[2] != 0 {
		t.Errorf("action %v", got)
	}
	for _, bad := range []Field{
		{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{4}},
		{Key: []string{"x"}, DType: memmap.Invalid, Shape: []int{3}},
		{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{3, -1}},
	} {
		if _, err := Create(filepath.Join(t.TempDir(), "q"), []int{3}, bad); err == nil {
			t.Errorf("Create with %+v succeeded", bad)
		}
	}
}

// TestTensor_GatherTo: the same bytes reach a writer from Go memory and
// from a mapping, for the whole tensor, a scalar, a view, and rows.
func TestTensor_GatherTo(t *testing.T) {
	data := make([]byte, 6*5*4)
	for i := range data {
		data[i] = byte(i)
	}
	heap := must[*Tensor](t)(FromBytes(memmap.Int32, []int{6, 5}, data))
	td := mustNew(t, 6)
	td.Set("x", heap)
	m := must[*TensorDict](t)(td.Memmap(filepath.Join(t.TempDir(), "p")))
	defer m.Close()
	mapped := must[*Tensor](t)(m.Tensor("x"))
	scalar := must[*Tensor](t)(FromBytes(memmap.Int32, []int{}, []byte{1, 2, 3, 4}))
	for _, x := range []struct {
		name string
		t    *Tensor
	}{{"heap", heap}, {"mapped", mapped}} {
		view := must[*Tensor](t)(x.t.Slice(2, 5))
		for _, tc := range []struct {
			name string
			t    *Tensor
			rows []int
			want []byte
		}{
			{"all", x.t, nil, data},
			{"rows", x.t, []int{5, 0, 1, 1}, slices.Concat(data[100:120], data[0:20], data[20:40], data[20:40])},
			{"a view", view, nil, data[40:100]},
			{"rows of a view", view, []int{2, 0}, slices.Concat(data[80:100], data[40:60])},
			{"a scalar", scalar, nil, []byte{1, 2, 3, 4}},
		} {
			t.Run(x.name+"/"+tc.name, func(t *testing.T) {
				var b bytes.Buffer
				n, err := tc.t.GatherTo(&b, tc.rows)
				if err != nil || n != int64(len(tc.want)) || !bytes.Equal(b.Bytes(), tc.want) {
					t.Fatalf("GatherTo = %d, %v, bytes %v; want %v", n, err, b.Bytes(), tc.want)
				}
			})
		}
		var b bytes.Buffer
		if _, err := x.t.GatherTo(&b, []int{0, 6}); !errors.Is(err, memmap.ErrIndex) || b.Len() != 0 {
			t.Errorf("%s: row 6 of 6: %v, %d bytes written; want ErrIndex and none", x.name, err, b.Len())
		}
	}
	if _, err := scalar.GatherTo(io.Discard, []int{0}); !errors.Is(err, memmap.ErrShape) {
		t.Errorf("rows of a scalar: %v, want ErrShape", err)
	}
}
