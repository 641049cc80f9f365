package tensordict

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"gorgonia.org/tensor"
)

// TestDenseDType_EveryDType checks that every memmap dtype has a Dense view
// of its item size, and that DTypeOf maps it back (float16 and bfloat16 read
// as uint16).
func TestDenseDType_EveryDType(t *testing.T) {
	for d := memmap.Bool; d.Valid(); d++ {
		dense := DenseDType(d)
		if dense == (tensor.Dtype{}) {
			t.Errorf("%v has no Dense dtype", d)
			continue
		}
		if got := int(dense.Size()); got != d.Size() {
			t.Errorf("%v: Dense dtype %v is %d bytes, want %d", d, dense, got, d.Size())
		}
		want := d
		if d == memmap.Float16 || d == memmap.BFloat16 {
			want = memmap.Uint16
		}
		if got, err := DTypeOf(dense); err != nil || got != want {
			t.Errorf("DTypeOf(%v) = %v, %v; want %v", dense, got, err, want)
		}
	}
	if got := DenseDType(memmap.Invalid); got != (tensor.Dtype{}) {
		t.Errorf("DenseDType(Invalid) = %v, want the zero Dtype", got)
	}
	if _, err := DTypeOf(tensor.String); !errors.Is(err, memmap.ErrDType) {
		t.Errorf("DTypeOf(string): err = %v, want ErrDType", err)
	}
}

func TestTensor_DenseAliasesMapping(t *testing.T) {
	mm, err := memmap.Create(filepath.Join(t.TempDir(), "x.memmap"), memmap.Float32, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mm.Close() })
	d := must[*tensor.Dense](t)(must[*Tensor](t)(View(mm, 0, mm.Shape()...)).Dense())
	if got := d.Shape(); len(got) != 2 || got[0] != 3 || got[1] != 2 {
		t.Fatalf("Dense shape %v, want (3, 2)", got)
	}
	if err := d.SetAt(float32(1.5), 2, 1); err != nil {
		t.Fatal(err)
	}
	if err := mm.Flush(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(mm.Path())
	if !bytes.Equal(raw[20:24], []byte{0, 0, 0xc0, 0x3f}) { // 1.5 as float32 LE
		t.Errorf("file bytes %v, want 1.5 at element 5", raw[20:24])
	}
	mm.Close()
	if _, err := must[*Tensor](t)(View(mm, 0, 3, 2)).Dense(); !errors.Is(err, memmap.ErrClosed) {
		t.Errorf("Dense after Close: err = %v, want ErrClosed", err)
	}
}

func TestCreateFromDense_CopiesCOrder(t *testing.T) {
	d := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]int32{0, 1, 2, 3, 4, 5}))
	tr, err := d.SafeT() // a transposed view [3, 2] whose data is not moved
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		d    *tensor.Dense
		want []int32
	}{
		{"contiguous", d, []int32{0, 1, 2, 3, 4, 5}},
		{"transposed view", tr, []int32{0, 3, 1, 4, 2, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := CreateFromDense(filepath.Join(t.TempDir(), "t.memmap"), tc.d)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.DType() != memmap.Int32 || !slices.Equal(m.Shape(), tc.d.Shape()) {
				t.Fatalf("got %v %v, want int32 %v", m.DType(), m.Shape(), tc.d.Shape())
			}
			raw, _ := os.ReadFile(m.Path())
			got := make([]int32, len(raw)/4)
			for i := range got {
				got[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("file holds %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCreateFromDense_UnsupportedDTypeCreatesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.memmap")
	d := tensor.New(tensor.WithShape(2), tensor.WithBacking([]string{"a", "b"}))
	if _, err := CreateFromDense(path, d); !errors.Is(err, memmap.ErrDType) {
		t.Fatalf("CreateFromDense of strings: err = %v, want ErrDType", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was left behind: %v", err)
	}
}
