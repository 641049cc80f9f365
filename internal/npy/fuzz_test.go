package npy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/internal/array/arraytest"
)

// fuzzReadLimit caps how much data FuzzReader reads, so that a header
// claiming terabytes costs no more than this.
const fuzzReadLimit = 1 << 20

// FuzzReader checks that any input either fails with a format or
// unsupported error or yields exactly Header().NumBytes() bytes before
// io.EOF, without panicking and whatever the read size; and that
// WriteHeader writes every header the Reader accepts.
func FuzzReader(f *testing.F) {
	names, err := filepath.Glob(filepath.Join("testdata", "*.npy"))
	if err != nil || len(names) == 0 {
		f.Fatalf("no seed files: %v", err)
	}
	for _, name := range names {
		in, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, n := range []int{len(in), len(in) - 1, len(in) / 2, 10} {
			f.Add(in[:n], uint16(3))
		}
	}
	for _, header := range []string{
		"{'descr': '>c16', 'fortran_order': True, 'shape': (1L, 2,)}",
		`{"shape": (), u"fortran_order": False, 'descr': '>f2'}`,
		"{'descr': [('a', '<f4', (2,)), ('b', [('c', '|u1')])], 'fortran_order': False, 'shape': (1,)}",
		"{'descr': '>i8', 'fortran_order': False, 'shape': (4611686018427387903, 0)}",
	} {
		in := append(preamble(header), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17)
		f.Add(in, uint16(5))
		in[len(magic)] = 2 // version 2.0 with the same bytes misread as a length
		f.Add(in, uint16(5))
	}
	f.Fuzz(func(t *testing.T, in []byte, chunk uint16) {
		r, err := NewReader(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrUnsupported) && !(err == io.EOF && len(in) == 0) {
				t.Fatalf("NewReader error %q wraps neither ErrFormat nor ErrUnsupported", err)
			}
			return
		}
		h := r.Header()
		size := h.NumBytes()
		if size < 0 {
			t.Fatalf("invalid header %v %v", h.DType, h.Shape)
		}

		var buf bytes.Buffer
		if err := WriteHeader(&buf, h); err != nil {
			t.Fatalf("WriteHeader(%v %v): %v", h.DType, h.Shape, err)
		}
		if r2, err := NewReader(&buf); err != nil {
			t.Fatalf("reading back WriteHeader(%v %v): %v", h.DType, h.Shape, err)
		} else if h2 := r2.Header(); h2.DType != h.DType || !slices.Equal(h2.Shape, h.Shape) {
			t.Fatalf("WriteHeader(%v %v) reads back as %v %v", h.DType, h.Shape, h2.DType, h2.Shape)
		}

		arraytest.CheckData(t, r, size, int(chunk)%4096+1, fuzzReadLimit, ErrFormat)
	})
}
