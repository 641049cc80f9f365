package array

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

func TestHeader_NumBytes(t *testing.T) {
	tests := []struct {
		name string
		h    Header
		want int64
	}{
		{"float32 2x3", Header{DType: memmap.Float32, Shape: []int{2, 3}}, 24},
		{"scalar", Header{DType: memmap.Complex128, Shape: nil}, 16},
		{"empty shape", Header{DType: memmap.Float64, Shape: []int{}}, 8},
		{"zero dim", Header{DType: memmap.Int64, Shape: []int{math.MaxInt, math.MaxInt, 0}}, 0},
		{"negative", Header{DType: memmap.Uint8, Shape: []int{2, -1}}, -1},
		{"overflow", Header{DType: memmap.Int16, Shape: []int{1 << 62}}, -1},
		{"max", Header{DType: memmap.Uint8, Shape: []int{math.MaxInt64}}, math.MaxInt64},
		{"invalid dtype", Header{DType: memmap.Invalid, Shape: []int{1}}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.h.NumBytes(); got != tt.want {
				t.Errorf("NumBytes() = %d, want %d", got, tt.want)
			}
		})
	}
}

var errBad = errors.New("bad data")

// decode is a toy format: no header, four uint8 elements, then a read error.
func decode(r io.Reader) (*Reader, error) {
	return NewReader(Header{DType: memmap.Uint8, Shape: []int{4}}, io.MultiReader(r, errReader{})), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errBad }

func TestOpen_NamesTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x")
	os.WriteFile(path, []byte{1, 2, 3, 4}, 0o644)
	f, err := Open(path, decode)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := f.Header()
	h.Shape[0] = 99
	if f.Header().Shape[0] != 4 {
		t.Error("Header returned the Reader's own Shape slice")
	}
	got, err := io.ReadAll(f)
	if !bytes.Equal(got, []byte{1, 2, 3, 4}) || !errors.Is(err, errBad) || !strings.HasPrefix(err.Error(), path+": ") {
		t.Errorf("ReadAll = %v, %v; want the data, then errBad prefixed by the file name", got, err)
	}
	if _, err := Open(path, func(io.Reader) (*Reader, error) { return nil, errBad }); !errors.Is(err, errBad) || !strings.HasPrefix(err.Error(), path+": ") {
		t.Errorf("decode error = %v, want errBad prefixed by the file name", err)
	}
	if _, err := Open(filepath.Join(dir, "missing"), decode); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
