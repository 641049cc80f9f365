package swap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/tensorwire/tensorwire/internal/array/arraytest"
)

var (
	errFormat = errors.New("test: malformed")
	errDisk   = errors.New("disk on fire")
)

// wrapDisk is a wrap hook that tags errors so tests can see it was applied.
func wrapDisk(err error) error { return fmt.Errorf("test: reading data: %w", err) }

// reversed returns data with each width-byte word reversed, computed
// independently of Words.
func reversed(data []byte, width int) []byte {
	out := make([]byte, len(data))
	for i := 0; i+width <= len(data); i += width {
		for j := range width {
			out[i+j] = data[i+width-1-j]
		}
	}
	return out
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// counter counts the bytes read from it.
type counter struct {
	r io.Reader
	n int
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReader_Data(t *testing.T) {
	sources := map[string]func(io.Reader) io.Reader{
		"plain":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
		"half":     iotest.HalfReader,
		"data EOF": iotest.DataErrReader,
	}
	for _, width := range []int{1, 2, 4, 8} {
		for _, size := range []int{0, width, 24, 8 * 101} {
			data := pattern(size)
			want := reversed(data, width)
			for name, src := range sources {
				for _, chunk := range []int{1, 3, 5, 8, 9, 64, 4096} {
					t.Run(fmt.Sprintf("w%d/n%d/%s/chunk=%d", width, size, name, chunk), func(t *testing.T) {
						in := append(data, "trailer"...)
						if name == "data EOF" {
							in = data // src ends with the last data byte
						}
						c := &counter{r: src(bytes.NewReader(in))}
						r := NewReader(c, width, int64(size), errFormat, wrapDisk, nil)
						got, err := arraytest.ReadAll(r, chunk)
						if err != io.EOF {
							t.Errorf("error = %v, want io.EOF", err)
						}
						if !bytes.Equal(got, want) {
							t.Errorf("data = % x, want % x", got, want)
						}
						if c.n != size {
							t.Errorf("read %d bytes from src, want exactly the %d data bytes", c.n, size)
						}
					})
				}
			}
		}
	}
}

// TestReader_IOReaderContract runs the standard library's io.Reader checks.
func TestReader_IOReaderContract(t *testing.T) {
	data := pattern(8 * 500)
	for _, width := range []int{1, 2, 4, 8} {
		r := NewReader(iotest.OneByteReader(bytes.NewReader(data)), width, int64(len(data)), errFormat, nil, nil)
		if err := iotest.TestReader(r, reversed(data, width)); err != nil {
			t.Errorf("width %d: %v", width, err)
		}
	}
}

func TestReader_Truncated(t *testing.T) {
	data := pattern(24)
	for _, width := range []int{1, 2, 4, 8} {
		for _, have := range []int{0, 1, 5, 13, 23} {
			for _, chunk := range []int{1, 4, 1024} {
				t.Run(fmt.Sprintf("w%d/have%d/chunk=%d", width, have, chunk), func(t *testing.T) {
					r := NewReader(bytes.NewReader(data[:have]), width, 24, errFormat, wrapDisk, nil)
					got, err := arraytest.ReadAll(r, chunk)
					if !errors.Is(err, errFormat) || !errors.Is(err, io.ErrUnexpectedEOF) {
						t.Fatalf("error = %v, want errFormat and io.ErrUnexpectedEOF", err)
					}
					if strings.Contains(err.Error(), "test: reading data") {
						t.Errorf("error %q went through wrap", err)
					}
					if msg := fmt.Sprintf("data ends after %d of 24 bytes", have); !strings.Contains(err.Error(), msg) {
						t.Errorf("error %q does not mention %q", err, msg)
					}
					whole := have - have%width
					if want := reversed(data[:whole], width); !bytes.Equal(got, want) {
						t.Errorf("data before the error = % x, want the whole words % x", got, want)
					}
					if _, again := r.Read(make([]byte, 8)); again != err {
						t.Errorf("second Read error = %v, want the same %v", again, err)
					}
				})
			}
		}
	}
}

func TestReader_SourceError(t *testing.T) {
	data := pattern(64)
	for _, wrap := range []func(error) error{nil, wrapDisk} {
		for _, n := range []int{0, 3, 8, 63} {
			src := io.MultiReader(bytes.NewReader(data[:n]), iotest.ErrReader(errDisk))
			r := NewReader(src, 4, 64, errFormat, wrap, nil)
			_, err := arraytest.ReadAll(r, 7)
			if !errors.Is(err, errDisk) || errors.Is(err, errFormat) {
				t.Errorf("n=%d: error = %v, want errDisk and not errFormat", n, err)
			}
			if wrapped := strings.HasPrefix(err.Error(), "test: reading data: "); wrapped != (wrap != nil) {
				t.Errorf("n=%d wrap=%v: error %q", n, wrap != nil, err)
			}
			if _, again := r.Read(make([]byte, 8)); again != err {
				t.Errorf("second Read error = %v, want the same %v", again, err)
			}
		}
	}
}

func TestReader_End(t *testing.T) {
	errTrailing := errors.New("trailing bytes")
	data := pattern(16)
	tests := []struct {
		name string
		end  func(src io.Reader) error
		want error
	}{
		{"nil result", func(io.Reader) error { return nil }, io.EOF},
		{"EOF", func(io.Reader) error { return io.EOF }, io.EOF},
		{"error", func(io.Reader) error { return errTrailing }, errTrailing},
		{"reads on", func(src io.Reader) error {
			if b, err := io.ReadAll(src); err != nil || string(b) != "tail" {
				return fmt.Errorf("after the data: %q, %v", b, err)
			}
			return nil
		}, io.EOF},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 3, 16, 100} {
			t.Run(fmt.Sprintf("%s/chunk=%d", tt.name, chunk), func(t *testing.T) {
				src := bytes.NewReader(append(data, "tail"...))
				calls := 0
				end := func() error {
					calls++
					if src.Len() != 4 {
						t.Errorf("end called with %d bytes left in src, want 4", src.Len())
					}
					return tt.end(src)
				}
				r := NewReader(src, 8, 16, errFormat, wrapDisk, end)
				got, err := arraytest.ReadAll(r, chunk)
				if err != tt.want {
					t.Errorf("error = %v, want %v", err, tt.want)
				}
				if want := reversed(data, 8); !bytes.Equal(got, want) {
					t.Errorf("data = % x, want % x", got, want)
				}
				for range 2 {
					if _, again := r.Read(make([]byte, 8)); again != err {
						t.Errorf("later Read error = %v, want the same %v", again, err)
					}
				}
				if calls != 1 {
					t.Errorf("end called %d times, want once", calls)
				}
			})
		}
	}
}

func TestReader_EmptyRead(t *testing.T) {
	r := NewReader(bytes.NewReader(pattern(8)), 4, 8, errFormat, nil, func() error {
		t.Error("end called by a Read with an empty buffer")
		return nil
	})
	if n, err := r.Read(make([]byte, 8)); n != 8 || err != nil {
		t.Fatalf("Read = %d, %v; want 8, nil", n, err)
	}
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Errorf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
}

func TestReader_NoAlloc(t *testing.T) {
	data := pattern(1 << 12)
	src := bytes.NewReader(data)
	buf := make([]byte, 7)
	r := NewReader(src, 8, int64(len(data)), errFormat, nil, nil)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Read allocates %v times per call, want 0", allocs)
	}
}

func TestNewReader_Panics(t *testing.T) {
	tests := []struct {
		width int
		n     int64
	}{
		{0, 0}, {3, 6}, {16, 16}, {-1, 0}, {4, 6}, {2, -2},
	}
	for _, tt := range tests {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewReader(width %d, n %d) did not panic", tt.width, tt.n)
				}
			}()
			NewReader(bytes.NewReader(nil), tt.width, tt.n, errFormat, nil, nil)
		}()
	}
}

func TestWords(t *testing.T) {
	in := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	tests := []struct {
		width int
		want  []byte
	}{
		{1, []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		{2, []byte{2, 1, 4, 3, 6, 5, 8, 7}},
		{4, []byte{4, 3, 2, 1, 8, 7, 6, 5}},
		{8, []byte{8, 7, 6, 5, 4, 3, 2, 1}},
		{3, []byte{1, 2, 3, 4, 5, 6, 7, 8}},
	}
	for _, tt := range tests {
		p := bytes.Clone(in)
		Words(p, tt.width)
		if !bytes.Equal(p, tt.want) {
			t.Errorf("Words(%d) = % x, want % x", tt.width, p, tt.want)
		}
		Words(p, tt.width)
		if !bytes.Equal(p, in) {
			t.Errorf("Words(%d) twice = % x, want the input back", tt.width, p)
		}
	}
	p := []byte{1, 2, 3, 4, 5}
	Words(p, 4)
	if want := []byte{4, 3, 2, 1, 5}; !bytes.Equal(p, want) {
		t.Errorf("Words with a partial word = % x, want % x", p, want)
	}
}
