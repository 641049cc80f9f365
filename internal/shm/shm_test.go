package shm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorwire/tensorwire/memmap"
)

func create(t *testing.T, size int) (*Map, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "words")
	m, err := Create(path, size, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, path
}

// TestWords: what one mapping stores, another mapping of the file reads,
// read-write or read-only; each operation of both word sizes.
func TestWords(t *testing.T) {
	w, path := create(t, 4096)
	rw, err := Open(path, 4096, true)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	ro, err := Open(path, 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	for _, tc := range []struct {
		name string
		do   func()            // through w
		off  int               // the word's offset
		want func(*Map) uint64 // read through another mapping
		val  uint64
	}{
		{"Store32", func() { w.Uint32(0).Store(7) }, 0, nil, 7},
		{"Add32", func() { w.Uint32(4).Add(3); w.Uint32(4).Add(^uint32(0)) }, 4, nil, 2},
		{"CAS32 hit", func() { w.Uint32(8).Store(1); w.Uint32(8).CompareAndSwap(1, 9) }, 8, nil, 9},
		{"CAS32 miss", func() { w.Uint32(12).Store(1); w.Uint32(12).CompareAndSwap(2, 9) }, 12, nil, 1},
		{"Store64", func() { w.Uint64(64).Store(1 << 40) }, 64, func(m *Map) uint64 { return m.Uint64(64).Load() }, 1 << 40},
		{"Add64", func() { w.Uint64(72).Add(5); w.Uint64(72).Add(1 << 33) }, 72, func(m *Map) uint64 { return m.Uint64(72).Load() }, 1<<33 + 5},
		{"CAS64", func() { w.Uint64(80).CompareAndSwap(0, 1<<50) }, 80, func(m *Map) uint64 { return m.Uint64(80).Load() }, 1 << 50},
		{"last word", func() { w.Uint32(4092).Store(5) }, 4092, nil, 5},
	} {
		tc.do()
		for _, m := range []*Map{w, rw, ro} {
			var got uint64
			if tc.want != nil {
				got = tc.want(m)
			} else {
				got = uint64(m.Uint32(tc.off).Load())
			}
			if got != tc.val {
				t.Errorf("%s: %s reads %d, want %d", tc.name, m.Name(), got, tc.val)
			}
		}
	}
	if b := ro.Bytes(); len(b) != 4096 || b[0] != 7 {
		t.Errorf("Bytes: %d bytes, first %d", len(b), b[0])
	}
}

// TestBadOffsets: a word out of the map or misaligned is a panic.
func TestBadOffsets(t *testing.T) {
	m := Over(make([]byte, 64))
	for _, tc := range []struct {
		name string
		get  func()
	}{
		{"32 misaligned", func() { m.Uint32(2) }},
		{"32 past the end", func() { m.Uint32(64) }},
		{"32 negative", func() { m.Uint32(-4) }},
		{"64 misaligned", func() { m.Uint64(4) }},
		{"64 straddling the end", func() { m.Uint64(60) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", tc.name)
				}
			}()
			tc.get()
		}()
	}
}

// TestOpenRefusals: what Create, Open and MapFile refuse.
func TestOpenRefusals(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		open func() (*Map, error)
		is   error
	}{
		{"Create over a file", func() (*Map, error) { return Create(short, 4096, 0o600) }, os.ErrExist},
		{"Create of no bytes", func() (*Map, error) { return Create(filepath.Join(dir, "none"), 0, 0o600) }, nil},
		{"Open missing", func() (*Map, error) { return Open(filepath.Join(dir, "missing"), 4096, false) }, os.ErrNotExist},
		{"Open short", func() (*Map, error) { return Open(short, 4096, true) }, memmap.ErrShortFile},
		{"Open a folder", func() (*Map, error) { return Open(dir, 4096, false) }, memmap.ErrShortFile},
	} {
		m, err := tc.open()
		if err == nil {
			m.Close()
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.is)
		}
	}
	if fi, err := os.Stat(short); err != nil || fi.Size() != 100 {
		t.Errorf("the file Create refused: %v, %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused Create left its file: %v", err)
	}
}

// TestGrow: a file grown while mapped is mapped again at its new size by a
// reader, which sees what was written before and after.
func TestGrow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, size := range []int{4096, 3 * 4096} {
		if err := Grow(f, size); err != nil {
			t.Fatal(err)
		}
		w, err := MapFile(f, size, true)
		if err != nil {
			t.Fatal(err)
		}
		w.Uint64(size - 8).Store(uint64(i + 1))
		r, err := Open(path, size, false)
		if err != nil {
			t.Fatal(err)
		}
		for j, off := range []int{4096 - 8, 3*4096 - 8}[:i+1] {
			if got := r.Uint64(off).Load(); got != uint64(j+1) {
				t.Errorf("size %d: word at %d = %d, want %d", size, off, got, j+1)
			}
		}
		r.Close()
		w.Close()
	}
}

// TestTruncatedFile: a word of a file truncated under its mapping faults,
// and under Guard that is an error wrapping memmap.ErrFault that names the
// file, not a SIGBUS. Guard returns fn's own error as it is.
func TestTruncatedFile(t *testing.T) {
	m, path := create(t, 2*4096)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	mine := errors.New("mine")
	for _, tc := range []struct {
		name string
		fn   func() error
		want error
	}{
		{"load", func() error { m.Uint32(4096).Load(); return nil }, memmap.ErrFault},
		{"store", func() error { m.Uint64(0).Store(1); return nil }, memmap.ErrFault},
		{"wake", func() error { m.Uint32(0).Wake(); return mine }, mine},
	} {
		err := m.Guard(tc.fn)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.want == memmap.ErrFault && err != nil && !contains(err.Error(), path) {
			t.Errorf("%s: %v does not name the file", tc.name, err)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// waits are the implementations of Wait the tests run: the platform's
// (the futex, on Linux) and the polling fallback, here too.
var waits = []struct {
	name string
	wait func(*Uint32, uint32, time.Duration)
	wake func(*Uint32)
}{
	{"Wait", (*Uint32).Wait, (*Uint32).Wake},
	{"poll", pollWait, func(*Uint32) { pollWake() }},
}

// TestWait_Goroutines: Wait across goroutines: it returns at once when the
// word has changed or d <= 0, after about d when nothing happens, and
// early on a change with a Wake, or (in this process) a Wake alone. When
// nothing happens, Wait may still return early, as its contract says (a
// signal: the Go runtime's preemption signal interrupts the futex, seen in
// CI as a 35 µs return): that case waits out d in a loop, as callers do,
// and asserts the loop slept rather than spun (a few calls, not
// thousands).
func TestWait_Goroutines(t *testing.T) {
	for _, impl := range waits {
		for _, tc := range []struct {
			name     string
			start    uint32        // the word's value
			old      uint32        // Wait's
			d        time.Duration // Wait's
			act      func(w *Uint32, wake func(*Uint32))
			min, max time.Duration // how long Wait may take
		}{
			{name: "changed already", start: 1, old: 0, d: time.Minute, max: time.Second},
			{name: "no time", start: 0, old: 0, d: 0, max: time.Second},
			{name: "negative time", start: 0, old: 0, d: -time.Second, max: time.Second},
			{name: "times out", start: 0, old: 0, d: 50 * time.Millisecond, min: 45 * time.Millisecond, max: 5 * time.Second},
			{name: "store and wake", start: 0, old: 0, d: time.Minute, max: 10 * time.Second,
				act: func(w *Uint32, wake func(*Uint32)) { w.Store(1); wake(w) }},
			{name: "wake alone", start: 0, old: 0, d: time.Minute, max: 10 * time.Second,
				act: func(w *Uint32, wake func(*Uint32)) { wake(w) }},
			{name: "add and wake", start: 5, old: 5, d: time.Minute, max: 10 * time.Second,
				act: func(w *Uint32, wake func(*Uint32)) { w.Add(1); wake(w) }},
		} {
			t.Run(impl.name+"/"+tc.name, func(t *testing.T) {
				m := Over(make([]byte, 64))
				w := m.Uint32(4)
				w.Store(tc.start)
				done := make(chan time.Duration, 1)
				go func() {
					t0 := time.Now()
					impl.wait(w, tc.old, tc.d)
					done <- time.Since(t0)
				}()
				if tc.act != nil {
					// Act until the waiter returns: a Wake sent before
					// it sleeps wakes nobody, and the test would wait d.
					tick := time.NewTicker(5 * time.Millisecond)
					defer tick.Stop()
					for {
						tc.act(w, impl.wake)
						select {
						case took := <-done:
							if took > tc.max {
								t.Errorf("Wait took %v, want at most %v", took, tc.max)
							}
							return
						case <-tick.C:
						}
					}
				}
				took := <-done
				if took > tc.max {
					t.Errorf("Wait took %v, want at most %v", took, tc.max)
				}
				if tc.min == 0 {
					return
				}
				// Nothing happens: Wait sleeps (it may return early, to
				// be called again for the rest of d).
				calls, t0 := 1, time.Now()
				for rest := tc.d - took; rest > 0; rest = tc.d - took - time.Since(t0) {
					impl.wait(w, tc.old, rest)
					calls++
				}
				if total := took + time.Since(t0); total < tc.min || total > tc.max || calls > 20 {
					t.Errorf("waiting out %v took %v in %d calls, want %v to %v in a few", tc.d, total, calls, tc.min, tc.max)
				}
			})
		}
	}
}

// TestWait_WakeUnblocksManyWaiters: one Wake after a change ends every
// waiter's sleep, and none is lost among many rounds.
func TestWait_ManyRounds(t *testing.T) {
	for _, impl := range waits {
		t.Run(impl.name, func(t *testing.T) {
			m := Over(make([]byte, 64))
			phase, ack := m.Uint32(0), m.Uint32(8)
			const waiters, rounds = 4, 200
			errc := make(chan error, waiters)
			for range waiters {
				go func() {
					for p := uint32(1); p <= rounds; p++ {
						for v := phase.Load(); v != p; v = phase.Load() {
							if v > p {
								errc <- fmt.Errorf("phase %d, waiting for %d", v, p)
								return
							}
							impl.wait(phase, v, time.Minute)
						}
						ack.Add(1)
					}
					errc <- nil
				}()
			}
			deadline := time.Now().Add(30 * time.Second)
			for p := uint32(1); p <= rounds; p++ {
				phase.Store(p)
				impl.wake(phase)
				for ack.Load() != p*waiters {
					if time.Now().After(deadline) {
						t.Fatalf("round %d: %d of %d waiters went on", p, ack.Load()-(p-1)*waiters, waiters)
					}
					time.Sleep(10 * time.Microsecond)
				}
			}
			for range waiters {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestWait_Processes: Wait and Wake across two processes mapping one file.
// The child (this test binary again) opens the file, says it is ready in
// word 4, waits on word 0 for up to a minute, and writes what it saw into
// word 8. The parent stores word 0 and wakes it: the child must be done
// long before its minute.
func TestWait_Processes(t *testing.T) {
	if testing.Short() && !Futex {
		t.Skip("polling across processes: the goroutine tests cover it")
	}
	m, path := create(t, 4096)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "SHM_HELPER="+path)
	out := make(chan error, 1)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { out <- cmd.Wait() }()
	ready := m.Uint32(4)
	for ready.Load() == 0 {
		ready.Wait(0, 10*time.Millisecond)
		if time.Since(t0) > 30*time.Second {
			cmd.Process.Kill()
			t.Fatal("the child never said it was ready")
		}
	}
	time.Sleep(20 * time.Millisecond) // let it sleep in Wait
	woke := time.Now()
	m.Uint32(0).Store(42)
	m.Uint32(0).Wake()
	select {
	case err := <-out:
		if err != nil {
			t.Fatalf("child: %v", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the child did not wake")
	}
	if took := time.Since(woke); took > 10*time.Second {
		t.Errorf("the child took %v to wake", took)
	}
	if got := m.Uint32(8).Load(); got != 42 {
		t.Errorf("the child saw %d, want 42", got)
	}
}

// TestHelperProcess is TestWait_Processes' child.
func TestHelperProcess(t *testing.T) {
	path := os.Getenv("SHM_HELPER")
	if path == "" {
		t.Skip("the child of TestWait_Processes")
	}
	m, err := Open(path, 4096, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	w := m.Uint32(0)
	m.Uint32(4).Store(1)
	m.Uint32(4).Wake()
	for t0 := time.Now(); w.Load() == 0 && time.Since(t0) < time.Minute; {
		w.Wait(0, time.Minute)
	}
	m.Uint32(8).Store(w.Load())
	os.Exit(exitCode(w.Load()))
}

func exitCode(v uint32) int {
	if v == 0 {
		return 3
	}
	return 0
}

// TestLayout: a word is its value and nothing more, at offset 0, since a
// map's bytes are cast to words and Wait passes the word's address.
func TestLayout(t *testing.T) {
	var a Uint32
	var b Uint64
	if unsafe.Sizeof(a) != 4 || unsafe.Offsetof(a.v) != 0 || unsafe.Sizeof(b) != 8 || unsafe.Offsetof(b.v) != 0 {
		t.Errorf("Uint32: %d bytes, value at %d; Uint64: %d bytes, value at %d",
			unsafe.Sizeof(a), unsafe.Offsetof(a.v), unsafe.Sizeof(b), unsafe.Offsetof(b.v))
	}
}
