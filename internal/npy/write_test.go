package npy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

// TestWriteHeader_NumPy checks that WriteHeader writes what np.save wrote.
func TestWriteHeader_NumPy(t *testing.T) {
	for _, name := range []string{"f4_2x3.npy", "bool.npy", "scalar_f8.npy", "f2.npy", "empty_0x3.npy"} {
		t.Run(name, func(t *testing.T) {
			in := readFile(t, name)
			r, err := NewReader(bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			h := r.Header()
			var buf bytes.Buffer
			if err := WriteHeader(&buf, h); err != nil {
				t.Fatal(err)
			}
			if want := in[:len(in)-int(h.NumBytes())]; !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("WriteHeader(%v %v) =\n%q, want\n%q", h.DType, h.Shape, buf.Bytes(), want)
			}
		})
	}
}

func TestWriteHeader_RoundTrip(t *testing.T) {
	shapes := [][]int{{}, {0}, {5}, {2, 3}, {1, 2, 3, 4}, {1 << 40, 0}, slices.Repeat([]int{1}, MaxDims)}
	for d := memmap.Bool; d.Valid(); d++ {
		if d == memmap.BFloat16 {
			continue
		}
		for _, shape := range shapes {
			t.Run(fmt.Sprintf("%s%v", d.Name(), shape), func(t *testing.T) {
				h := Header{DType: d, Shape: shape}
				var buf bytes.Buffer
				if err := WriteHeader(&buf, h); err != nil {
					t.Fatal(err)
				}
				if buf.Len()%64 != 0 {
					t.Errorf("header is %d bytes, want a multiple of 64", buf.Len())
				}
				data := make([]byte, min(h.NumBytes(), 1024))
				for i := range data {
					data[i] = byte(i)
				}
				buf.Write(data)
				r, err := NewReader(&buf)
				if err != nil {
					t.Fatalf("NewReader: %v", err)
				}
				if got := r.Header(); got.DType != d || !slices.Equal(got.Shape, shape) {
					t.Errorf("read back %v %v", got.DType, got.Shape)
				}
				if got, err := io.ReadAll(r); h.NumBytes() <= 1024 && (err != nil || !bytes.Equal(got, data)) {
					t.Errorf("read back data % x, %v; want % x", got, err, data)
				}
			})
		}
	}
}

func TestWriteHeader_Errors(t *testing.T) {
	errWrite := errors.New("pipe closed")
	tests := []struct {
		name string
		h    Header
		w    io.Writer
		want error
	}{
		{"bfloat16", Header{DType: memmap.BFloat16, Shape: []int{1}}, io.Discard, ErrUnsupported},
		{"invalid dtype", Header{DType: memmap.Invalid, Shape: []int{1}}, io.Discard, memmap.ErrDType},
		{"negative dim", Header{DType: memmap.Float32, Shape: []int{2, -1}}, io.Discard, memmap.ErrShape},
		{"overflow", Header{DType: memmap.Float32, Shape: []int{1 << 62}}, io.Discard, memmap.ErrShape},
		{"too many dims", Header{DType: memmap.Uint8, Shape: slices.Repeat([]int{1}, MaxDims+1)}, io.Discard, memmap.ErrShape},
		{"write error", Header{DType: memmap.Uint8, Shape: []int{1}}, errWriter{errWrite}, errWrite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := WriteHeader(tt.w, tt.h); !errors.Is(err, tt.want) {
				t.Errorf("WriteHeader error = %v, want %v", err, tt.want)
			}
		})
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }
