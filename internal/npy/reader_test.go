package npy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/tensorwire/tensorwire/internal/array/arraytest"
	"github.com/tensorwire/tensorwire/memmap"
)

// le returns the little-endian bytes of the given values, which must be
// fixed-size.
func le(vals ...any) []byte {
	var b []byte
	for _, v := range vals {
		b, _ = binary.Append(b, binary.LittleEndian, v)
	}
	return b
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// numpyFiles are the supported files written by NumPy (see testdata/gen.py)
// with the values they hold.
var numpyFiles = []struct {
	name  string
	dtype memmap.DType
	shape []int
	want  []byte // little-endian
}{
	{"f4_2x3.npy", memmap.Float32, []int{2, 3}, le(float32(0), float32(1.5), float32(-2), float32(3.25), float32(100), float32(-0.5))},
	{"i4_be.npy", memmap.Int32, []int{4}, le(int32(1), int32(-2), int32(65536), int32(math.MaxInt32))},
	{"bool.npy", memmap.Bool, []int{3}, []byte{1, 0, 1}},
	{"scalar_f8.npy", memmap.Float64, []int{}, le(3.5)},
	{"f2.npy", memmap.Float16, []int{3}, []byte{0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38}},
	{"c8_be.npy", memmap.Complex64, []int{2}, le(complex64(1+2i), complex64(-0.5-1i))},
	{"u8_be_v2.npy", memmap.Uint64, []int{3}, le(uint64(1), uint64(math.MaxUint64), uint64(0x0102030405060708))},
	{"i8_v3.npy", memmap.Int64, []int{2}, le(int64(-1), int64(7))},
	{"empty_0x3.npy", memmap.Float64, []int{0, 3}, nil},
	{"two_arrays.npy", memmap.Int16, []int{3}, le(int16(1), int16(2), int16(3))},
}

func TestReader_NumPyFiles(t *testing.T) {
	for _, tt := range numpyFiles {
		in := readFile(t, tt.name)
		for _, chunk := range []int{1, 3, 4096} {
			t.Run(fmt.Sprintf("%s/chunk=%d", tt.name, chunk), func(t *testing.T) {
				r, err := NewReader(iotest.HalfReader(bytes.NewReader(in)))
				if err != nil {
					t.Fatalf("NewReader: %v", err)
				}
				h := r.Header()
				if h.DType != tt.dtype || !slices.Equal(h.Shape, tt.shape) || h.Shape == nil {
					t.Errorf("Header() = %v %#v, want %v %v", h.DType, h.Shape, tt.dtype, tt.shape)
				}
				if h.NumBytes() != int64(len(tt.want)) {
					t.Errorf("NumBytes() = %d, want %d", h.NumBytes(), len(tt.want))
				}
				got, err := arraytest.ReadAll(r, chunk)
				if err != io.EOF {
					t.Errorf("Read error = %v, want io.EOF", err)
				}
				if !bytes.Equal(got, tt.want) {
					t.Errorf("data = % x, want % x", got, tt.want)
				}
			})
		}
	}
}

// wantData returns the values held by one of numpyFiles.
func wantData(t *testing.T, name string) []byte {
	for _, f := range numpyFiles {
		if f.name == name {
			return f.want
		}
	}
	t.Fatalf("%s is not in numpyFiles", name)
	return nil
}

// TestReader_IOReaderContract runs the standard library's io.Reader checks.
func TestReader_IOReaderContract(t *testing.T) {
	for _, tt := range numpyFiles {
		r, err := NewReader(iotest.OneByteReader(bytes.NewReader(readFile(t, tt.name))))
		if err != nil {
			t.Fatal(err)
		}
		if err := iotest.TestReader(r, tt.want); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestReader_Sequence(t *testing.T) {
	src := bytes.NewReader(readFile(t, "two_arrays.npy"))
	want := []struct {
		dtype memmap.DType
		shape []int
		data  []byte
	}{
		{memmap.Int16, []int{3}, le(int16(1), int16(2), int16(3))},
		{memmap.Uint8, []int{2, 2}, []byte{1, 2, 3, 4}},
	}
	for i, w := range want {
		r, err := NewReader(src)
		if err != nil {
			t.Fatalf("array %d: NewReader: %v", i, err)
		}
		if h := r.Header(); h.DType != w.dtype || !slices.Equal(h.Shape, w.shape) {
			t.Errorf("array %d: Header() = %v %v, want %v %v", i, h.DType, h.Shape, w.dtype, w.shape)
		}
		if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, w.data) {
			t.Errorf("array %d: data = % x, %v; want % x", i, got, err, w.data)
		}
	}
	if _, err := NewReader(src); err != io.EOF {
		t.Errorf("NewReader at the end = %v, want io.EOF", err)
	}
}

func TestReader_Unsupported(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		msg  string
	}{
		{"structured", readFile(t, "structured.npy"), "structured dtype [('x', '<f4'), ('y', '<i4')]"},
		{"unicode", readFile(t, "unicode.npy"), `"<U3"`},
		{"object", readFile(t, "object.npy"), `"|O"`},
		{"datetime", readFile(t, "datetime.npy"), `"<M8[D]"`},
		{"fortran", readFile(t, "fortran_i2.npy"), "[2 3] in Fortran order"},
		{"version 4.0", []byte("\x93NUMPY\x04\x00\x10\x00\x00\x00{}"), "version 4.0"},
		{"version 1.1", []byte("\x93NUMPY\x01\x01\x02\x00{}"), "version 1.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewReader(bytes.NewReader(tt.in))
			if !errors.Is(err, ErrUnsupported) || errors.Is(err, ErrFormat) {
				t.Fatalf("error = %v, want ErrUnsupported only", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
}

func TestNewReader_Errors(t *testing.T) {
	valid := readFile(t, "f4_2x3.npy")
	v2 := readFile(t, "u8_be_v2.npy")
	tests := []struct {
		name      string
		in        []byte
		truncated bool
		msg       string
	}{
		{"short magic", []byte("\x93NUM"), true, "magic"},
		{"bad magic", []byte("PK\x03\x04\x14\x00\x00\x00"), false, `magic string "PK\x03\x04\x14\x00"`},
		{"short length", valid[:9], true, "header length"},
		{"short header", valid[:40], true, "reading header"},
		{"huge header", []byte("\x93NUMPY\x02\x00\xff\xff\xff\xff{}"), false, "header length 4294967295"},
		{"short v2 header", v2[:100], true, "reading header"},
		{"not a dict", []byte("\x93NUMPY\x01\x00\x04\x00(1,)"), false, "not a dict"},
		{"bad literal", []byte("\x93NUMPY\x01\x00\x03\x00{x}"), false, `unexpected name "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewReader(bytes.NewReader(tt.in))
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error = %v, want ErrFormat", err)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) != tt.truncated {
				t.Errorf("error %q: errors.Is(err, io.ErrUnexpectedEOF) = %v, want %v", err, !tt.truncated, tt.truncated)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
	if _, err := NewReader(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("NewReader(empty) = %v, want io.EOF", err)
	}
}

func TestReader_Truncated(t *testing.T) {
	for _, name := range []string{"f4_2x3.npy", "u8_be_v2.npy", "c8_be.npy"} {
		in := readFile(t, name)
		in = in[:len(in)-5]
		for _, chunk := range []int{1, 5, 4096} {
			t.Run(fmt.Sprintf("%s/chunk=%d", name, chunk), func(t *testing.T) {
				r, err := NewReader(bytes.NewReader(in))
				if err != nil {
					t.Fatal(err)
				}
				size := r.Header().NumBytes()
				got, err := arraytest.ReadAll(r, chunk)
				if !errors.Is(err, ErrFormat) || !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("Read error = %v, want ErrFormat and io.ErrUnexpectedEOF", err)
				}
				if msg := fmt.Sprintf("data ends after %d of %d bytes", size-5, size); !strings.Contains(err.Error(), msg) {
					t.Errorf("Read error %q does not mention %q", err, msg)
				}
				// Big-endian data comes in whole words only.
				if want := wantData(t, name); len(got) < int(size)-5-7 || !bytes.Equal(got, want[:len(got)]) {
					t.Errorf("data before the error = % x, want a prefix of % x of at least %d bytes", got, want, size-5-7)
				}
			})
		}
	}
}

func TestReader_SourceError(t *testing.T) {
	errDisk := errors.New("disk on fire")
	in := readFile(t, "i4_be.npy")
	for _, n := range []int{3, 9, 20, len(in) - 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r, err := NewReader(io.MultiReader(bytes.NewReader(in[:n]), iotest.ErrReader(errDisk)))
			if err == nil {
				_, err = arraytest.ReadAll(r, 3)
			}
			if !errors.Is(err, errDisk) || errors.Is(err, ErrFormat) {
				t.Errorf("error = %v, want errDisk and not ErrFormat", err)
			}
		})
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.npy")
	short := filepath.Join(dir, "short.npy")
	full := readFile(t, "i4_be.npy")
	for name, b := range map[string][]byte{empty: nil, short: full[:len(full)-1]} {
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	r, err := Open(filepath.Join("testdata", "two_arrays.npy"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, le(int16(1), int16(2), int16(3))) {
		t.Errorf("ReadAll = % x, %v; want the first array only", got, err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	r, err = Open(short)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := io.ReadAll(r); !errors.Is(err, io.ErrUnexpectedEOF) || !strings.HasPrefix(err.Error(), short+": ") {
		t.Errorf("ReadAll error = %v, want io.ErrUnexpectedEOF prefixed by the file name", err)
	}

	if _, err := Open(empty); !errors.Is(err, ErrFormat) || !strings.HasPrefix(err.Error(), empty+": ") {
		t.Errorf("Open(empty) error = %v, want ErrFormat prefixed by the file name", err)
	}
	if _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) error = %v, want os.ErrNotExist", err)
	}
}
