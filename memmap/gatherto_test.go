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
	"time"
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

// TestGatherTo_CloseDoesNotWait: Close while GatherTo waits for a peer that
// does not read returns at once (before, it waited for the peer: a store
// dropping a value waited for the slowest worker still receiving it), the
// write goes on from the mapping it pinned, whole and right, and the
// mapping is let go when it returns.
func TestGatherTo_CloseDoesNotWait(t *testing.T) {
	m := patterned(t, 64, 1<<20) // 64 MiB: more than the socket buffers hold
	want := make([]byte, 64<<20)
	if err := m.GatherAt(want, 0, 64<<20, []int{0}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	w, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	peer := <-accepted
	if peer == nil {
		t.Fatal("no connection")
	}
	defer peer.Close()
	sent := make(chan error, 1)
	go func() {
		_, err := m.GatherTo(w, 0, 64<<20, []int{0})
		w.(*net.TCPConn).CloseWrite()
		sent <- err
	}()
	time.Sleep(100 * time.Millisecond) // the writer is blocked on the peer by now
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a GatherTo whose peer does not read")
	}
	if _, err := m.GatherTo(io.Discard, 0, 1<<20, []int{0}); !errors.Is(err, ErrClosed) {
		t.Fatalf("GatherTo after Close: %v, want ErrClosed", err)
	}
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("the GatherTo that Close did not wait for: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the peer got %d bytes unlike the %d mapped", len(got), len(want))
	}
	m.mu.Lock()
	released := m.released
	m.mu.Unlock()
	if !released {
		t.Fatal("the mapping was kept after the last GatherTo returned")
	}
}
