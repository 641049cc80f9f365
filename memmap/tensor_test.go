package memmap

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// rowsOf returns the bytes of n rows of rs bytes, row i filled with byte i+1.
func rowsOf(n, rs int) []byte {
	b := make([]byte, n*rs)
	for i := range n {
		for j := range rs {
			b[i*rs+j] = byte(i + 1)
		}
	}
	return b
}

func mustCreate(t *testing.T, dt DType, shape ...int) *Tensor {
	t.Helper()
	m, err := Create(filepath.Join(t.TempDir(), "x.memmap"), dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestCreate_ZeroFilled(t *testing.T) {
	m := mustCreate(t, Float32, 100, 7)
	fi, err := os.Stat(m.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 100*7*4 {
		t.Fatalf("file size %d, want %d", fi.Size(), 100*7*4)
	}
	got, _ := os.ReadFile(m.Path())
	if !bytes.Equal(got, make([]byte, len(got))) {
		t.Error("new file is not zero-filled")
	}
	entries, _ := os.ReadDir(filepath.Dir(m.Path()))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the tensor (no temp file left)", len(entries))
	}
}

func TestCreate_BadShape(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		dt    DType
		shape []int
		want  error
	}{
		{"negative", Uint8, []int{3, -1}, ErrShape},
		{"overflow", Float64, []int{1 << 40, 1 << 40}, ErrShape},
		{"invalid dtype", Invalid, []int{3}, ErrDType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Create(filepath.Join(dir, tc.name), tc.dt, tc.shape...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, tc.name)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a file was left behind: %v", err)
			}
		})
	}
}

func TestCreate_ReplacesWithoutFaultingOldMappings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.memmap")
	old, err := Create(path, Uint8, 4, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Scatter([]int{0, 1, 2, 3}, rowsOf(4, 1024)); err != nil {
		t.Fatal(err)
	}
	repl, err := Create(path, Uint8, 2, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close()
	got := make([]byte, 1024)
	if err := old.Gather(got, []int{3}); err != nil {
		t.Fatalf("old mapping after replace: %v", err)
	}
	if got[0] != 4 {
		t.Errorf("old mapping row 3 = %d, want 4", got[0])
	}
	if err := repl.Gather(got, []int{1}); err != nil || got[0] != 0 {
		t.Errorf("new tensor row 1 = %d, %v; want zeros", got[0], err)
	}
}

// TestCreate_NameNearTheLimit creates files whose names are 239 to 255
// bytes, all within the 255 that Linux's, macOS' and Windows' file systems
// take: each is created and is the only entry of its folder after. Before
// the fix, names over 239 bytes failed with ENAMETOOLONG: the temporary
// name "."+name+".tmp-" and up to 10 digits was over the limit. A short
// name's temporary file keeps the name (importer's sweep of a crash's
// leftovers, ".<key>.memmap.tmp-*", relies on it).
func TestCreate_NameNearTheLimit(t *testing.T) {
	for _, n := range []int{239, 240, 250, 255} {
		dir := t.TempDir()
		name := strings.Repeat("n", n-len(".memmap")) + ".memmap"
		m, err := Create(filepath.Join(dir, name), Int32, 2)
		if err != nil {
			t.Errorf("Create of a %d-byte name: %v", n, err)
			continue
		}
		m.Close()
		if ents, _ := os.ReadDir(dir); len(ents) != 1 || ents[0].Name() != name {
			t.Errorf("after Create of a %d-byte name the folder holds %v, want the file alone", n, ents)
		}
	}
	dir := t.TempDir()
	f, err := createTemp(dir, "x.memmap")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if base := filepath.Base(f.Name()); !strings.HasPrefix(base, ".x.memmap.tmp-") {
		t.Errorf("temporary file for x.memmap: %s, want .x.memmap.tmp-*", base)
	}
}

func TestOpen_Sizes(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		fileSize int
		shape    []int
		want     error
	}{
		{"exact", 24, []int{2, 3}, nil},
		{"longer file", 40, []int{2, 3}, nil},
		{"short file", 20, []int{2, 3}, ErrShortFile},
		{"empty file, zero elements", 0, []int{0, 3}, nil},
		{"empty file, scalar", 0, []int{}, ErrShortFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if err := os.WriteFile(path, make([]byte, tc.fileSize), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := Open(path, Float32, tc.shape, ReadOnly)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if err == nil {
				m.Close()
			}
		})
	}
	if _, err := Open(filepath.Join(dir, "missing"), Uint8, []int{1}, ReadOnly); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: err = %v, want fs.ErrNotExist", err)
	}
	if _, err := Open(dir, Uint8, []int{0}, ReadOnly); err == nil {
		t.Error("opening a directory succeeded")
	}
}

func TestTensor_GatherScatterAllDTypes(t *testing.T) {
	for d := Bool; d < numDTypes; d++ {
		t.Run(d.Name(), func(t *testing.T) {
			m := mustCreate(t, d, 10, 3)
			rs := m.RowBytes()
			if rs != 3*d.Size() {
				t.Fatalf("RowBytes = %d, want %d", rs, 3*d.Size())
			}
			rows := []int{7, 0, 9}
			if err := m.Scatter(rows, rowsOf(3, rs)); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4*rs)
			if err := m.Gather(got, []int{0, 9, 7, 7}); err != nil {
				t.Fatal(err)
			}
			want := append(append(append(bytes.Repeat([]byte{2}, rs), bytes.Repeat([]byte{3}, rs)...),
				bytes.Repeat([]byte{1}, rs)...), bytes.Repeat([]byte{1}, rs)...)
			if !bytes.Equal(got, want) {
				t.Errorf("gathered %v, want %v", got, want)
			}
		})
	}
}

func TestTensor_BadRowsTouchNothing(t *testing.T) {
	m := mustCreate(t, Int32, 5, 2)
	for _, tc := range []struct {
		name string
		rows []int
		n    int
		want error
	}{
		{"past the end", []int{0, 5}, 2, ErrIndex},
		{"negative", []int{-1}, 1, ErrIndex},
		{"short buffer", []int{0, 1}, 1, ErrShape},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := rowsOf(tc.n, m.RowBytes())
			if err := m.Scatter(tc.rows, src); !errors.Is(err, tc.want) {
				t.Errorf("Scatter err = %v, want %v", err, tc.want)
			}
			if err := m.Gather(make([]byte, len(src)), tc.rows); !errors.Is(err, tc.want) {
				t.Errorf("Gather err = %v, want %v", err, tc.want)
			}
		})
	}
	if err := m.Fill([]int{1, 5}, []byte{1, 0, 0, 0}); !errors.Is(err, ErrIndex) {
		t.Errorf("Fill past the end: err = %v, want ErrIndex", err)
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(m.Path())
	if !bytes.Equal(got, make([]byte, 40)) {
		t.Errorf("a refused call wrote to the file: %v", got)
	}
	scalar := mustCreate(t, Int32)
	if err := scalar.Gather(nil, nil); !errors.Is(err, ErrShape) {
		t.Errorf("gather on a scalar: err = %v, want ErrShape", err)
	}
}

func TestTensor_Fill(t *testing.T) {
	m := mustCreate(t, Int16, 6, 5)
	if err := m.Fill([]int{1, 4}, []byte{0x34, 0x12}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, m.NumBytes())
	if _, err := m.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6*5; i++ {
		v := int(got[2*i]) | int(got[2*i+1])<<8
		want := 0
		if row := i / 5; row == 1 || row == 4 {
			want = 0x1234
		}
		if v != want {
			t.Fatalf("element %d = %#x, want %#x", i, v, want)
		}
	}
	if err := m.Fill([]int{0}, []byte{1}); !errors.Is(err, ErrDType) {
		t.Errorf("fill with a 1-byte element on int16: err = %v, want ErrDType", err)
	}
}

func TestTensor_ReadAtWriteAt(t *testing.T) {
	m := mustCreate(t, Uint8, 10)
	if n, err := m.WriteAt([]byte{1, 2, 3}, 8); !errors.Is(err, ErrIndex) || n != 0 {
		t.Errorf("write past the end: n=%d err=%v, want 0, ErrIndex", n, err)
	}
	if n, err := m.WriteAt([]byte{1, 2}, 8); err != nil || n != 2 {
		t.Fatalf("write at the end: n=%d err=%v", n, err)
	}
	p := make([]byte, 4)
	if n, err := m.ReadAt(p, 7); n != 3 || err != io.EOF || !bytes.Equal(p[:3], []byte{0, 1, 2}) {
		t.Errorf("ReadAt over the end = %d, %v, %v; want 3, EOF, [0 1 2]", n, err, p[:3])
	}
	if n, err := m.ReadAt(p, 10); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at the end = %d, %v; want 0, EOF", n, err)
	}
	if _, err := m.ReadAt(p, -1); !errors.Is(err, ErrIndex) {
		t.Errorf("ReadAt at -1: err = %v, want ErrIndex", err)
	}
}

func TestTensor_UseAfterClose(t *testing.T) {
	m := mustCreate(t, Uint8, 4, 4)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	buf := make([]byte, 4)
	calls := map[string]error{
		"Gather":  m.Gather(buf, []int{0}),
		"Scatter": m.Scatter([]int{0}, buf),
		"Fill":    m.Fill([]int{0}, buf[:1]),
		"Flush":   m.Flush(),
		"Evict":   m.Evict(),
	}
	_, calls["ReadAt"] = m.ReadAt(buf, 0)
	_, calls["WriteAt"] = m.WriteAt(buf, 0)
	_, calls["Bytes"] = m.Bytes()
	for name, err := range calls {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", name, err)
		}
	}
}

func TestTensor_ReadOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.memmap")
	if err := os.WriteFile(path, []byte{1, 2, 3, 4}, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Open(path, Uint8, []int{2, 2}, ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Scatter([]int{0}, []byte{9, 9}); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Scatter on read-only: err = %v, want ErrReadOnly", err)
	}
	if _, err := m.WriteAt([]byte{9}, 0); !errors.Is(err, ErrReadOnly) {
		t.Errorf("WriteAt on read-only: err = %v, want ErrReadOnly", err)
	}
	b, err := m.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	// A write through the view of a read-only mapping stays in this process.
	b[0] = 77
	if got, _ := os.ReadFile(path); got[0] != 1 {
		t.Errorf("write through a read-only view reached the file: %v", got)
	}
}

func TestTensor_FaultOnTruncatedFileIsAnError(t *testing.T) {
	m := mustCreate(t, Uint8, 64, 4096)
	if err := os.Truncate(m.Path(), 4096); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if err := m.Gather(buf, []int{0}); err != nil {
		t.Errorf("row in the remaining page: %v", err)
	}
	if err := m.Gather(buf, []int{10}); !errors.Is(err, ErrFault) {
		t.Errorf("gather past the truncation: err = %v, want ErrFault", err)
	}
	if err := m.Scatter([]int{63}, buf); !errors.Is(err, ErrFault) {
		t.Errorf("scatter past the truncation: err = %v, want ErrFault", err)
	}
	if err := m.Gather(buf, []int{0}); err != nil {
		t.Errorf("the tensor is unusable after a fault: %v", err)
	}
}

func TestTensor_BytesAliasesMapping(t *testing.T) {
	m := mustCreate(t, Float32, 3, 2)
	b, err := m.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != m.NumBytes() || cap(b) != m.NumBytes() {
		t.Fatalf("Bytes: len %d cap %d, want %d", len(b), cap(b), m.NumBytes())
	}
	copy(b[20:], []byte{0, 0, 0xc0, 0x3f}) // 1.5 as float32 LE, element 5
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(m.Path())
	if !bytes.Equal(raw[20:24], []byte{0, 0, 0xc0, 0x3f}) {
		t.Errorf("file bytes %v, want 1.5 at element 5", raw[20:24])
	}
}

// TestTensor_SharedAcrossProcesses writes rows from a child process through
// its own mapping and reads them here without reopening.
func TestTensor_SharedAcrossProcesses(t *testing.T) {
	if path := os.Getenv("MEMMAP_TEST_CHILD"); path != "" {
		m, err := Open(path, Uint8, []int{8, 256}, ReadWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Fill([]int{2, 5}, []byte{7}); err != nil {
			t.Fatal(err)
		}
		m.Close()
		return
	}
	m := mustCreate(t, Uint8, 8, 256)
	cmd := exec.Command(os.Args[0], "-test.run=^TestTensor_SharedAcrossProcesses$")
	cmd.Env = append(os.Environ(), "MEMMAP_TEST_CHILD="+m.Path())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := make([]byte, 8*256)
	if _, err := m.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for r := range 8 {
		want := byte(0)
		if r == 2 || r == 5 {
			want = 7
		}
		if !bytes.Equal(got[r*256:(r+1)*256], bytes.Repeat([]byte{want}, 256)) {
			t.Errorf("row %d = %v..., want all %d", r, got[r*256], want)
		}
	}
}

// TestTensor_ConcurrentAccessAndClose runs gathers and scatters from many
// goroutines while Close happens: every call succeeds until it returns
// ErrClosed, and none crashes. Close comes once every goroutine has made a
// call, and each goroutine calls until it sees ErrClosed, so Close always
// lands among calls in flight.
func TestTensor_ConcurrentAccessAndClose(t *testing.T) {
	m := mustCreate(t, Uint8, 64, 512)
	var wg, started sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			buf := make([]byte, 512)
			for i := 0; ; i++ {
				if i == 1 {
					started.Done()
				}
				r := rng.IntN(64)
				var err error
				if g%2 == 0 {
					err = m.Scatter([]int{r}, buf)
				} else {
					err = m.Gather(buf, []int{r})
				}
				switch {
				case errors.Is(err, ErrClosed) && i > 0:
					return
				case err != nil:
					t.Errorf("call %d: %v", i, err)
					if i == 0 {
						started.Done()
					}
					return
				}
			}
		}()
	}
	started.Wait()
	m.Close()
	wg.Wait()
}

func TestParseDType(t *testing.T) {
	for d := Bool; d < numDTypes; d++ {
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, err)
		}
		if got, err := ParseDType(d.Name()); err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.Name(), got, err)
		}
	}
	for _, bad := range []string{"", "torch.", "torch.float8_e4m3fn", "float32 ", "torch.qint8"} {
		if _, err := ParseDType(bad); !errors.Is(err, ErrDType) {
			t.Errorf("ParseDType(%q): err = %v, want ErrDType", bad, err)
		}
	}
	if got, _ := ParseDType("long"); got != Int64 {
		t.Errorf("alias long = %v", got)
	}
}

// TestGuard: a fault inside Guard is an error wrapping ErrFault, fn's own
// error comes back as it is, and other panics pass through.
func TestGuard(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g")
	m, err := Create(path, Uint8, 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b, err := m.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	mine := errors.New("mine")
	for _, tc := range []struct {
		name string
		fn   func() error
		want error
	}{
		{"fault", func() error { b[4096] = 1; return nil }, ErrFault},
		{"fn's error", func() error { return mine }, mine},
		{"no error", func() error { return nil }, nil},
	} {
		if err := Guard(tc.fn); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"a panic", func() error { panic("other") }},
		{"a nil dereference", func() error {
			var p *[1 << 10]byte
			p[0] = 1
			return nil
		}},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("%s: recovered nothing, want the panic to pass through Guard", tc.name)
				}
			}()
			err := Guard(tc.fn)
			t.Errorf("%s: Guard returned %v", tc.name, err)
		}()
	}
}

// TestCreateUnsynced: the same file as Create's, zero-filled, mapped and
// in place at once (its folder's sync is the caller's).
func TestCreateUnsynced(t *testing.T) {
	dir := t.TempDir()
	m, err := CreateUnsynced(filepath.Join(dir, "x.memmap"), Int32, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Scatter([]int{2}, bytes.Repeat([]byte{7}, 20)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "x.memmap"))
	if err != nil || len(got) != 60 || !bytes.Equal(got[40:], bytes.Repeat([]byte{7}, 20)) || !bytes.Equal(got[:40], make([]byte, 40)) {
		t.Fatalf("file %v, %v; want 40 zeros then row 2's sevens", got, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the folder holds %d entries, want the file alone (no temporary one)", len(ents))
	}
}
