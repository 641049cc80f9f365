// Package arraytest holds what the tests of the array decoders (internal/idx,
// internal/npy) and of the byte-swapping reader under them (internal/swap)
// share: reading in chunks of a chosen size, and the data contract every
// decoder's fuzz target checks.
package arraytest

import (
	"errors"
	"io"
	"testing"
)

// ReadAll reads r in calls of chunk bytes until the first error, and returns
// everything read and that error (io.EOF included).
func ReadAll(r io.Reader, chunk int) ([]byte, error) {
	var out []byte
	p := make([]byte, chunk)
	for {
		n, err := r.Read(p)
		out = append(out, p[:n]...)
		if err != nil {
			return out, err
		}
	}
}

// CheckData reads r, a decoder's data whose header promises size bytes, in
// calls of chunk bytes, and fails t unless every call returns 0 <= n <=
// chunk, the total never passes size, io.EOF comes exactly after size bytes,
// and any other error wraps errFormat. It stops after limit bytes, so that a
// header claiming terabytes costs no more.
func CheckData(t testing.TB, r io.Reader, size int64, chunk int, limit int64, errFormat error) {
	t.Helper()
	p := make([]byte, chunk)
	var total int64
	for total < limit {
		n, err := r.Read(p)
		if n < 0 || n > len(p) {
			t.Fatalf("Read returned n = %d for len(p) = %d", n, len(p))
		}
		total += int64(n)
		if total > size {
			t.Fatalf("read %d bytes, more than NumBytes() = %d", total, size)
		}
		if err == io.EOF {
			if total != size {
				t.Fatalf("io.EOF after %d bytes, want NumBytes() = %d", total, size)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, errFormat) {
				t.Fatalf("Read error %q does not wrap %v", err, errFormat)
			}
			return
		}
	}
}
