package memmap

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// sink is a writer GatherTo writes to, and how to get what it wrote.
type sink struct {
	w    io.Writer
	read func() []byte // closes w's end, returns every byte written
}

// sinks are the writers GatherTo treats differently: a socket and a file
// (descriptors: straight from the mapping) and a buffer (anything else:
// through a copy).
var sinks = []struct {
	name string
	make func(t *testing.T) sink
}{
	{"socket", func(t *testing.T) sink {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan []byte, 1)
		go func() {
			// The listener closes once it has accepted: closed before, it
			// would reset the connection waiting in its backlog.
			c, err := l.Accept()
			l.Close()
			if err != nil {
				got <- nil
				return
			}
			defer c.Close()
			b, _ := io.ReadAll(c)
			got <- b
		}()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return sink{c, func() []byte { c.Close(); return <-got }}
	}},
	{"file", func(t *testing.T) sink {
		f, err := os.Create(filepath.Join(t.TempDir(), "out"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return sink{f, func() []byte {
			f.Close()
			b, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			return b
		}}
	}},
	{"buffer", func(t *testing.T) sink {
		var b bytes.Buffer
		return sink{&b, b.Bytes}
	}},
}

// patterned returns a tensor of rows x width bytes, each byte distinct
// enough that a row out of place or a shifted byte shows.
func patterned(t *testing.T, rows, width int) *Tensor {
	t.Helper()
	m := mustCreate(t, Uint8, rows, width)
	b, err := m.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = byte(i*7 + i/width)
	}
	return m
}

func TestGatherTo(t *testing.T) {
	small := patterned(t, 4096, 16)
	big := patterned(t, 16, 300_000) // rows of 300 KB; 16 of them are several copy buffers
	many := make([]int, 5000)        // more pieces than one writev takes
	for i := range many {
		many[i] = rand.IntN(4096)
	}
	for _, s := range sinks {
		for _, tc := range []struct {
			name string
			m    *Tensor
			off  int64
			rb   int
			rows []int
		}{
			{"one row", small, 0, 16, []int{7}},
			{"a run", small, 0, 16, []int{1, 2, 3, 4}},
			{"repeats, out of order", small, 0, 16, []int{3, 0, 3, 4095, 2}},
			{"no rows", small, 0, 16, []int{}},
			{"many rows", small, 0, 16, many},
			{"a view", small, 40, 8, []int{0, 5, 6}},
			{"large rows", big, 0, 300_000, []int{15, 0, 1, 2, 3, 9}},
			{"everything", big, 0, 16 * 300_000, []int{0}},
		} {
			t.Run(s.name+"/"+tc.name, func(t *testing.T) {
				want := make([]byte, len(tc.rows)*tc.rb)
				if err := tc.m.GatherAt(want, tc.off, tc.rb, tc.rows); err != nil {
					t.Fatal(err)
				}
				sk := s.make(t)
				n, err := tc.m.GatherTo(sk.w, tc.off, tc.rb, tc.rows)
				if err != nil || n != int64(len(want)) {
					t.Fatalf("GatherTo = %d, %v; want %d bytes", n, err, len(want))
				}
				if got := sk.read(); !bytes.Equal(got, want) {
					t.Fatalf("wrote %d bytes unlike GatherAt's %d", len(got), len(want))
				}
			})
		}
	}
}

// TestGatherTo_Refused: a bad index, or a closed tensor, writes nothing.
func TestGatherTo_Refused(t *testing.T) {
	for _, s := range sinks {
		t.Run(s.name, func(t *testing.T) {
			m := patterned(t, 8, 4)
			sk := s.make(t)
			if _, err := m.GatherTo(sk.w, 0, 4, []int{1, 8}); !errors.Is(err, ErrIndex) {
				t.Errorf("row 8 of 8: %v, want ErrIndex", err)
			}
			if _, err := m.GatherTo(sk.w, 4, 4, []int{7}); !errors.Is(err, ErrIndex) {
				t.Errorf("a view's row past the data: %v, want ErrIndex", err)
			}
			m.Close()
			if _, err := m.GatherTo(sk.w, 0, 4, []int{0}); !errors.Is(err, ErrClosed) {
				t.Errorf("after Close: %v, want ErrClosed", err)
			}
			if got := sk.read(); len(got) != 0 {
				t.Errorf("%d bytes written by refused calls", len(got))
			}
		})
	}
}

// TestGatherTo_TruncatedFile: rows past a truncation are an error wrapping
// ErrFault, whether the kernel (a descriptor) or a guarded copy touched
// them, and the process and the tensor go on.
func TestGatherTo_TruncatedFile(t *testing.T) {
	for _, s := range sinks {
		t.Run(s.name, func(t *testing.T) {
			m := patterned(t, 64, 4096)
			want := make([]byte, 4096)
			if err := m.Gather(want, []int{0}); err != nil {
				t.Fatal(err)
			}
			if err := m.CheckFile(); err != nil {
				t.Fatalf("CheckFile before the truncation: %v", err)
			}
			if err := os.Truncate(m.Path(), 4096); err != nil {
				t.Fatal(err)
			}
			if err := m.CheckFile(); !errors.Is(err, ErrFault) {
				t.Fatalf("CheckFile after the truncation: %v, want ErrFault", err)
			}
			sk := s.make(t)
			if _, err := m.GatherTo(sk.w, 0, 4096, []int{0}); err != nil {
				t.Fatalf("the row in the remaining page: %v", err)
			}
			if _, err := m.GatherTo(sk.w, 0, 4096, []int{10}); !errors.Is(err, ErrFault) {
				t.Fatalf("a row past the truncation: %v, want ErrFault", err)
			}
			// The faulting row's first page is past the file's end: not a
			// byte of it can have been read.
			if got := sk.read(); !bytes.Equal(got, want) {
				t.Fatalf("wrote %d bytes, want exactly the row before the truncation", len(got))
			}
			buf := make([]byte, 4096)
			if err := m.Gather(buf, []int{0}); err != nil {
				t.Fatalf("the tensor is unusable after a fault: %v", err)
			}
		})
	}
}
