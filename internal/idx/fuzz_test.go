package idx

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tensorwire/tensorwire/internal/array/arraytest"
)

// fuzzReadLimit caps how much data FuzzReader reads, so that a header
// claiming terabytes costs no more than this.
const fuzzReadLimit = 1 << 20

// FuzzReader checks that any input either fails with a format error or
// yields exactly Header().NumBytes() bytes before io.EOF, without panicking
// and whatever the read size.
func FuzzReader(f *testing.F) {
	seeds := [][]byte{
		file(0x08, []uint32{2, 3}, []byte{1, 2, 3, 4, 5, 6}),
		file(0x09, []uint32{1}, []byte{0x80}),
		file(0x0B, []uint32{2}, []byte{1, 2, 3, 4}),
		file(0x0C, []uint32{1, 1}, []byte{1, 2, 3, 4}),
		file(0x0D, []uint32{2}, []byte{0x3f, 0xc0, 0, 0, 0xc0, 0, 0, 0}),
		file(0x0E, []uint32{1}, []byte{1, 2, 3, 4, 5, 6, 7, 8}),
		file(0x0E, []uint32{0xffffffff, 0xffffffff}, nil),
	}
	for _, s := range seeds {
		gz := gzipped(f, s)
		for _, in := range [][]byte{s, s[:len(s)-1], s[:len(s)/2], gz, gz[:len(gz)-1], gz[:len(gz)/2]} {
			f.Add(in, uint16(3))
		}
	}
	f.Fuzz(func(t *testing.T, in []byte, chunk uint16) {
		r, err := NewReader(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("NewReader error %q does not wrap ErrFormat", err)
			}
			return
		}
		h := r.Header()
		size := h.NumBytes()
		if size < 0 || h.DType.Size() == 0 || len(h.Shape) == 0 {
			t.Fatalf("invalid header %v %v, NumBytes %d", h.DType, h.Shape, size)
		}
		arraytest.CheckData(t, r, size, int(chunk)%4096+1, fuzzReadLimit, ErrFormat)
	})
}
