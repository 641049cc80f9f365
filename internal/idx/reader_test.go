package idx

import (
	"bytes"
	"compress/gzip"
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
	"github.com/tensorwire/tensorwire/internal/swap"
	"github.com/tensorwire/tensorwire/memmap"
)

// file returns an IDX file with the given type byte, dimensions and
// (big-endian) data.
func file(typ byte, dims []uint32, data []byte) []byte {
	b := []byte{0, 0, typ, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	return append(b, data...)
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func le32(f float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(f)) }
func be32(f float32) []byte { return binary.BigEndian.AppendUint32(nil, math.Float32bits(f)) }
func le64(f float64) []byte { return binary.LittleEndian.AppendUint64(nil, math.Float64bits(f)) }
func be64(f float64) []byte { return binary.BigEndian.AppendUint64(nil, math.Float64bits(f)) }

func TestReader_Types(t *testing.T) {
	tests := []struct {
		name  string
		typ   byte
		dims  []uint32
		data  []byte // as stored: big-endian
		dtype memmap.DType
		want  []byte // little-endian
	}{
		{"uint8", 0x08, []uint32{2, 2}, []byte{0, 1, 128, 255}, memmap.Uint8, []byte{0, 1, 128, 255}},
		{"int8", 0x09, []uint32{3}, []byte{0x80, 0x7f, 0xff}, memmap.Int8, []byte{0x80, 0x7f, 0xff}},
		{"int16", 0x0B, []uint32{3}, []byte{0x01, 0x02, 0xff, 0xfe, 0x80, 0x00},
			memmap.Int16, []byte{0x02, 0x01, 0xfe, 0xff, 0x00, 0x80}},
		{"int32", 0x0C, []uint32{1, 2}, []byte{0x01, 0x02, 0x03, 0x04, 0xff, 0xff, 0xff, 0xfe},
			memmap.Int32, []byte{0x04, 0x03, 0x02, 0x01, 0xfe, 0xff, 0xff, 0xff}},
		{"float32", 0x0D, []uint32{2, 1, 1}, slices.Concat(be32(1.5), be32(-2)),
			memmap.Float32, slices.Concat(le32(1.5), le32(-2))},
		{"float32 literal", 0x0D, []uint32{1}, []byte{0x3f, 0xc0, 0, 0}, memmap.Float32, []byte{0, 0, 0xc0, 0x3f}},
		{"float64", 0x0E, []uint32{3}, slices.Concat(be64(3.25), be64(-0.5), be64(math.Inf(1))),
			memmap.Float64, slices.Concat(le64(3.25), le64(-0.5), le64(math.Inf(1)))},
		{"empty", 0x0E, []uint32{0, 4000000000}, nil, memmap.Float64, nil},
	}
	for _, tt := range tests {
		for _, gz := range []bool{false, true} {
			in := file(tt.typ, tt.dims, tt.data)
			if gz {
				in = gzipped(t, in)
			}
			for _, chunk := range []int{1, 3, 5, 4096} {
				t.Run(fmt.Sprintf("%s/gzip=%v/chunk=%d", tt.name, gz, chunk), func(t *testing.T) {
					r, err := NewReader(iotest.HalfReader(bytes.NewReader(in)))
					if err != nil {
						t.Fatalf("NewReader: %v", err)
					}
					h := r.Header()
					wantShape := make([]int, len(tt.dims))
					for i, d := range tt.dims {
						wantShape[i] = int(d)
					}
					if h.DType != tt.dtype || !slices.Equal(h.Shape, wantShape) {
						t.Errorf("Header() = %v %v, want %v %v", h.DType, h.Shape, tt.dtype, wantShape)
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
}

// TestReader_IOReaderContract runs the standard library's io.Reader checks.
func TestReader_IOReaderContract(t *testing.T) {
	data := make([]byte, 4*1000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	want := slices.Clone(data)
	swap.Words(want, 4)
	for _, gz := range []bool{false, true} {
		in := file(0x0C, []uint32{10, 100}, data)
		if gz {
			in = gzipped(t, in)
		}
		r, err := NewReader(iotest.OneByteReader(bytes.NewReader(in)))
		if err != nil {
			t.Fatal(err)
		}
		if err := iotest.TestReader(r, want); err != nil {
			t.Errorf("gzip=%v: %v", gz, err)
		}
	}
}

func TestNewReader_Errors(t *testing.T) {
	valid := file(0x08, []uint32{2, 3}, make([]byte, 6))
	corruptGz := gzipped(t, valid)
	corruptGz[12] ^= 0xff // inside the deflate stream
	tests := []struct {
		name      string
		in        []byte
		truncated bool   // also wraps io.ErrUnexpectedEOF
		msg       string // in the error message
	}{
		{"empty", nil, true, "magic"},
		{"one byte", []byte{0}, true, "magic"},
		{"short magic", []byte{0, 0, 8}, true, "magic"},
		{"bad magic", []byte{0, 1, 8, 1, 0, 0, 0, 0}, false, "magic number 00 01 08 01"},
		{"unknown type", file(0x0A, []uint32{1}, []byte{0}), false, "type byte 0x0a"},
		{"zero dims", file(0x08, nil, nil), false, "0 dimensions"},
		{"17 dims", file(0x08, make([]uint32, 17), nil), false, "17 dimensions"},
		{"short dims", valid[:9], true, "dimensions"},
		{"overflow", file(0x0E, []uint32{1 << 31, 1 << 31, 1 << 31}, nil), false, "overflows"},
		{"gzip magic only", []byte{0x1f, 0x8b}, true, "gzip"},
		{"bad gzip header", []byte{0x1f, 0x8b, 0, 0, 0, 0, 0, 0, 0, 0, 0}, false, "gzip"},
		{"truncated gzip", gzipped(t, valid)[:15], true, ""},
		{"corrupt gzip", corruptGz, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewReader(bytes.NewReader(tt.in))
			if err == nil {
				// Damage inside a gzip stream may only show in the data.
				_, err = arraytest.ReadAll(r, 64)
			}
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error = %v, want ErrFormat", err)
			}
			if got := errors.Is(err, io.ErrUnexpectedEOF); got != tt.truncated {
				t.Errorf("error %q: errors.Is(err, io.ErrUnexpectedEOF) = %v, want %v", err, got, tt.truncated)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
}

func TestReader_DataErrors(t *testing.T) {
	data := slices.Concat(be32(1), be32(2), be32(3))
	full := file(0x0D, []uint32{3}, data)
	badSum := gzipped(t, full)
	badSum[len(badSum)-8] ^= 1 // CRC-32 in the gzip trailer
	tests := []struct {
		name      string
		in        []byte
		want      []byte // data read before the error
		truncated bool
		msg       string
	}{
		{"truncated", full[:len(full)-6], le32(1), true, "data ends after 6 of 12 bytes"},
		{"truncated gzip", gzipped(t, full[:len(full)-2]), slices.Concat(le32(1), le32(2)), true, "10 of 12"},
		{"trailing", append(slices.Clone(full), 0), slices.Concat(le32(1), le32(2), le32(3)), false, "trailing"},
		{"trailing gzip", gzipped(t, append(slices.Clone(full), 0)), slices.Concat(le32(1), le32(2), le32(3)), false, "trailing"},
		{"bad checksum", badSum, slices.Concat(le32(1), le32(2), le32(3)), false, "checksum"},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 4, 1024} {
			t.Run(fmt.Sprintf("%s/chunk=%d", tt.name, chunk), func(t *testing.T) {
				r, err := NewReader(bytes.NewReader(tt.in))
				if err != nil {
					t.Fatalf("NewReader: %v", err)
				}
				got, err := arraytest.ReadAll(r, chunk)
				if !errors.Is(err, ErrFormat) {
					t.Fatalf("Read error = %v, want ErrFormat", err)
				}
				if errors.Is(err, io.ErrUnexpectedEOF) != tt.truncated {
					t.Errorf("Read error %q: wrong io.ErrUnexpectedEOF wrapping", err)
				}
				if !strings.Contains(err.Error(), tt.msg) {
					t.Errorf("Read error %q does not mention %q", err, tt.msg)
				}
				if !bytes.Equal(got, tt.want) {
					t.Errorf("data before error = % x, want % x", got, tt.want)
				}
				if _, again := r.Read(make([]byte, 8)); again != err {
					t.Errorf("second Read error = %v, want the same %v", again, err)
				}
			})
		}
	}
}

// TestReader_SourceError checks that an error of the underlying reader is
// passed on, and not mistaken for a format error.
func TestReader_SourceError(t *testing.T) {
	errDisk := errors.New("disk on fire")
	in := file(0x08, []uint32{100}, make([]byte, 100))
	tests := []struct {
		name string
		n    int // bytes before the error
	}{
		{"in magic", 1},
		{"in header", 6},
		{"in data", 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := io.MultiReader(bytes.NewReader(in[:tt.n]), iotest.ErrReader(errDisk))
			r, err := NewReader(src)
			if err == nil {
				_, err = arraytest.ReadAll(r, 7)
			}
			if !errors.Is(err, errDisk) || errors.Is(err, ErrFormat) {
				t.Errorf("error = %v, want errDisk and not ErrFormat", err)
			}
		})
	}
}

func TestReader_HeaderIsCopy(t *testing.T) {
	r, err := NewReader(bytes.NewReader(file(0x08, []uint32{2}, []byte{1, 2})))
	if err != nil {
		t.Fatal(err)
	}
	r.Header().Shape[0] = 99
	if got := r.Header().Shape[0]; got != 2 {
		t.Errorf("Shape[0] = %d after modifying a copy, want 2", got)
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.idx.gz")
	short := filepath.Join(dir, "short.idx")
	bad := filepath.Join(dir, "bad.idx")
	full := file(0x0B, []uint32{2}, []byte{1, 2, 3, 4})
	for name, b := range map[string][]byte{good: gzipped(t, full), short: full[:len(full)-1], bad: []byte("PK\x03\x04")} {
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	r, err := Open(good)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r); err != nil || !bytes.Equal(got, []byte{2, 1, 4, 3}) {
		t.Errorf("ReadAll = % x, %v; want 02 01 04 03", got, err)
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

	if _, err := Open(bad); !errors.Is(err, ErrFormat) || !strings.HasPrefix(err.Error(), bad+": ") {
		t.Errorf("Open(bad) error = %v, want ErrFormat prefixed by the file name", err)
	}
	if _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) error = %v, want os.ErrNotExist", err)
	}
}
