package memmap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"golang.org/x/sys/unix"
)

// Tests of writes to rows whose pages are not in the page cache, which
// Linux writes with pwrite instead of through the mapping
// (direct_linux.go).

// residentPages returns how many of the pages under data bytes [a, b) are
// in the page cache.
func residentPages(t *testing.T, m *Tensor, a, b int) int {
	t.Helper()
	page := a &^ (pageSize - 1)
	vec := make([]byte, (b-page+pageSize-1)/pageSize)
	if err := mincore(m.data[page:b], vec); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// makeCold writes m's data back and drops it from the page cache, and
// skips the test if the pages stay (tmpfs keeps them: there they are never
// cold).
func makeCold(t *testing.T, m *Tensor) {
	t.Helper()
	if err := m.Evict(); err != nil {
		t.Fatal(err)
	}
	if n := residentPages(t, m, 0, m.NumBytes()); n != 0 {
		t.Skipf("%d pages stay in the page cache after Evict (tmpfs?): no cold pages here", n)
	}
}

// randomBytes returns n bytes from a fixed seed.
func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// checkFile checks m's data against want twice: as read(2) sees the file
// (the page cache), and through m's mapping.
func checkFile(t *testing.T, m *Tensor, want []byte) {
	t.Helper()
	checkRead(t, m, want)
	viaMap := make([]byte, m.NumBytes())
	if _, err := m.ReadAt(viaMap, 0); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "mapping", m.RowBytes(), viaMap, want)
}

// checkRead checks the file, as read(2) sees it, against want.
func checkRead(t *testing.T, m *Tensor, want []byte) {
	t.Helper()
	raw, err := os.ReadFile(m.Path())
	if err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "file", m.RowBytes(), raw, want)
}

// checkBytes reports the first byte of got that differs from want.
func checkBytes(t *testing.T, name string, rowBytes int, got, want []byte) {
	t.Helper()
	if i := firstDiff(got, want); i >= 0 && i < min(len(got), len(want)) {
		t.Errorf("%s: byte %d (row %d of %d bytes) = %d, want %d", name, i, i/max(rowBytes, 1), rowBytes, got[i], want[i])
	} else if i >= 0 {
		t.Errorf("%s: %d bytes, want %d", name, len(got), len(want))
	}
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestTensor_ColdAndWarmRows writes runs of rows some of whose pages are in
// the page cache and some not, rows not page-aligned (80,000 bytes: every
// edge page shared with a neighbour), repeated rows, and checks every byte
// of the file against a model.
func TestTensor_ColdAndWarmRows(t *testing.T) {
	const nrows, rs = 12, 80000
	tests := []struct {
		name string
		warm []int // rows read (so cached) after the eviction
		op   string
		rows []int  // scatter and fill
		at   [2]int // writeAt: bytes [at[0], at[1])
	}{
		{name: "scatter cold run", op: "scatter", rows: []int{2, 3, 4}},
		{name: "scatter run with a warm row", warm: []int{6}, op: "scatter", rows: []int{5, 6, 7, 8}},
		{name: "scatter repeated row cold then warm", warm: []int{9}, op: "scatter", rows: []int{1, 9, 1, 10}},
		{name: "scatter all warm", warm: []int{3, 4}, op: "scatter", rows: []int{4, 3}},
		{name: "fill mixed", warm: []int{1, 11}, op: "fill", rows: []int{0, 1, 2, 11}},
		{name: "fill single cold rows", op: "fill", rows: []int{7, 3, 5}},
		{name: "writeAt mid-row to mid-row", warm: []int{5}, op: "writeAt", at: [2]int{3*rs + 1234, 7*rs + 777}},
		{name: "writeAt small", op: "writeAt", at: [2]int{rs - 10, rs + 10}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustCreate(t, Uint8, nrows, rs)
			want := randomBytes(nrows*rs, uint64(i))
			if _, err := m.WriteAt(want, 0); err != nil {
				t.Fatal(err)
			}
			makeCold(t, m)
			row := make([]byte, rs)
			for _, r := range tt.warm {
				if err := m.Gather(row, []int{r}); err != nil {
					t.Fatal(err)
				}
			}
			src := randomBytes(len(tt.rows)*rs, uint64(100+i))
			var err error
			switch tt.op {
			case "scatter":
				err = m.Scatter(tt.rows, src)
				for k, r := range tt.rows {
					copy(want[r*rs:(r+1)*rs], src[k*rs:(k+1)*rs])
				}
			case "fill":
				err = m.Fill(tt.rows, []byte{0xa5})
				for _, r := range tt.rows {
					copy(want[r*rs:(r+1)*rs], bytes.Repeat([]byte{0xa5}, rs))
				}
			case "writeAt":
				p := randomBytes(tt.at[1]-tt.at[0], uint64(200+i))
				var n int
				n, err = m.WriteAt(p, int64(tt.at[0]))
				if err == nil && n != len(p) {
					t.Errorf("WriteAt = %d, want %d", n, len(p))
				}
				copy(want[tt.at[0]:], p)
			}
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, m, want)
		})
	}
}

// TestTensor_ColdWritePartialPages fills rows of a view that starts 1 byte
// into an int16 tensor, so every element straddles the view's row starts
// and every page boundary falls inside an element, with one page in the
// middle of a row cached and its neighbours not: the fill's pattern must
// stay in phase across the stretches written with pwrite and through the
// mapping, and across pwritev calls (the rows are 6 MB: more than one
// pwritev's 4 MiB).
func TestTensor_ColdWritePartialPages(t *testing.T) {
	const n = 3_000_000 // int16 elements per row: 6,000,000 bytes
	m := mustCreate(t, Int16, 3, n)
	want := randomBytes(m.NumBytes(), 1)
	if _, err := m.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	makeCold(t, m)
	// Cache one page in the middle of row 1 of the view, alone: no
	// readahead, no fault-around.
	if err := unix.Madvise(m.data, unix.MADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	const off, rb = 1, 2 * n
	mid := (off + rb + rb/2) &^ (pageSize - 1)
	one := make([]byte, 1)
	if _, err := m.ReadAt(one, int64(mid+5)); err != nil {
		t.Fatal(err)
	}
	if got := residentPages(t, m, mid-pageSize, mid+2*pageSize); got != 1 {
		t.Fatalf("%d of 3 pages around the page read are cached, want just it", got)
	}
	elem := []byte{0x12, 0x34}
	if err := m.FillAt(off, rb, []int{1, 0}, elem); err != nil {
		t.Fatal(err)
	}
	for i := off; i < off+2*rb; i++ {
		want[i] = elem[(i-off)%2]
	}
	checkFile(t, m, want)
}

// TestTensor_ColdWriteTakesNoPageFaults counts this thread's page faults
// while writing rows that are not in the page cache: through the mapping,
// that is one fault per page written; with pwrite, none on the mapping.
func TestTensor_ColdWriteTakesNoPageFaults(t *testing.T) {
	// 1024 pages: the few faults of the call's own allocations (more under
	// the race detector, which shadows them) stay far below one per page.
	const nrows, rs = 4, 1 << 20
	pages := nrows * rs / pageSize
	src := randomBytes(nrows*rs, 3)
	ops := map[string]func(m *Tensor) error{
		"scatter": func(m *Tensor) error { return m.Scatter([]int{0, 1, 2, 3}, src) },
		"fill":    func(m *Tensor) error { return m.Fill([]int{0, 1, 2, 3}, []byte{9}) },
		"writeAt": func(m *Tensor) error { _, err := m.WriteAt(src, 0); return err },
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			m := mustCreate(t, Uint8, nrows, rs) // reserved, never written: not cached
			if n := residentPages(t, m, 0, m.NumBytes()); n != 0 {
				t.Skipf("%d pages of a new file are cached (tmpfs?)", n)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := threadFaults(t)
			err := op(m)
			faults := threadFaults(t) - before
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d page faults writing %d cold pages", faults, pages)
			if faults >= int64(pages/4) {
				t.Errorf("writing %d cold pages took %d page faults, want next to none", pages, faults)
			}
			want := src
			if name == "fill" {
				want = bytes.Repeat([]byte{9}, len(src))
			}
			checkFile(t, m, want)
		})
	}
}

// threadFaults returns the page faults (minor and major) of the calling
// thread so far.
func threadFaults(t *testing.T) int64 {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt + ru.Majflt
}

// TestTensor_ColdWriteReadOnlyRefused checks that a read-only tensor
// refuses writes to cold rows (the pwrite path must not bypass the check)
// and that the file is unchanged.
func TestTensor_ColdWriteReadOnlyRefused(t *testing.T) {
	const nrows, rs = 4, 128 << 10
	m := mustCreate(t, Uint8, nrows, rs)
	want := randomBytes(nrows*rs, 4)
	if _, err := m.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(); err != nil { // Evict of a read-only tensor cannot write back
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := Open(m.Path(), Uint8, []int{nrows, rs}, ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	makeCold(t, ro)
	if err := ro.Scatter([]int{1, 2}, make([]byte, 2*rs)); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Scatter: err = %v, want ErrReadOnly", err)
	}
	if err := ro.Fill([]int{0, 1, 2, 3}, []byte{1}); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Fill: err = %v, want ErrReadOnly", err)
	}
	if n, err := ro.WriteAt(make([]byte, rs), rs); n != 0 || !errors.Is(err, ErrReadOnly) {
		t.Errorf("WriteAt = %d, %v, want 0, ErrReadOnly", n, err)
	}
	checkFile(t, ro, want)
}

// TestOpenFile_AppendModeWritesInPlace maps a file opened with O_APPEND,
// with which Linux's pwrite appends whatever the offset: writes to cold
// rows must still land in their rows, and the file must not grow.
func TestOpenFile_AppendModeWritesInPlace(t *testing.T) {
	const nrows, rs = 4, 128 << 10
	path := filepath.Join(t.TempDir(), "x.memmap")
	c, err := Create(path, Uint8, nrows, rs)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := OpenFile(f, Uint8, []int{nrows, rs}, ReadWrite)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	defer m.Close()
	makeCold(t, m)
	if err := m.Fill([]int{1, 2}, []byte{5}); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, nrows*rs)
	copy(want[rs:3*rs], bytes.Repeat([]byte{5}, 2*rs))
	checkFile(t, m, want)
}

// TestTensor_ColdWriteTruncatedFile writes cold rows of a file truncated
// under the mapping: the rows past the end are ErrFault, as through the
// mapping, and the file is not grown back.
func TestTensor_ColdWriteTruncatedFile(t *testing.T) {
	const rs = 128 << 10
	m := mustCreate(t, Uint8, 8, rs)
	if err := os.Truncate(m.Path(), rs); err != nil {
		t.Fatal(err)
	}
	if err := m.Scatter([]int{5}, make([]byte, rs)); !errors.Is(err, ErrFault) {
		t.Errorf("scatter past the truncation: err = %v, want ErrFault", err)
	}
	if err := m.Fill([]int{6, 7}, []byte{1}); !errors.Is(err, ErrFault) {
		t.Errorf("fill past the truncation: err = %v, want ErrFault", err)
	}
	if _, err := m.WriteAt(make([]byte, rs), 4*rs); !errors.Is(err, ErrFault) {
		t.Errorf("WriteAt past the truncation: err = %v, want ErrFault", err)
	}
	if err := m.Fill([]int{0}, []byte{3}); err != nil {
		t.Errorf("fill of the row left: %v", err)
	}
	if fi, err := os.Stat(m.Path()); err != nil || fi.Size() != rs {
		t.Errorf("after the writes the file is %v bytes (%v), want %d", fi.Size(), err, rs)
	}
}

// TestTensor_ColdWriteFullDisk writes rows of a sparse file on a full
// tmpfs: each write that does not fit is an error wrapping ENOSPC (not a
// SIGBUS, not ErrFault) and leaves every row as it was; the writes that fit
// succeed.
func TestTensor_ColdWriteFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a small tmpfs to fill (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting the tmpfs: %v", err)
		}
	})
	const nrows, rs = 16, 256 << 10 // 4 MiB of data, sparse, on 1 MiB
	path := filepath.Join(dir, "sparse.memmap")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, nrows*rs); err != nil {
		t.Fatal(err)
	}
	m, err := Open(path, Uint8, []int{nrows, rs}, ReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() }) // before the unmount
	want := make([]byte, nrows*rs)
	if err := m.Fill([]int{0}, []byte{1}); err != nil { // 256 KiB of the 1 MiB
		t.Fatal(err)
	}
	copy(want, bytes.Repeat([]byte{1}, rs))

	// Only read(2) checks the file here: reading a hole of a tmpfs file
	// through a mapping allocates a page, which this full disk has not.
	if err := m.Scatter([]int{3, 4, 5, 6}, randomBytes(4*rs, 5)); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("scatter of 1 MiB: err = %v, want ENOSPC", err)
	}
	checkRead(t, m, want)
	if err := m.Fill([]int{1, 2, 3, 4}, []byte{2}); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("fill of 1 MiB: err = %v, want ENOSPC", err)
	}
	checkRead(t, m, want)
	if n, err := m.WriteAt(randomBytes(4*rs, 6), 8*rs+100); n != 0 || !errors.Is(err, unix.ENOSPC) {
		t.Errorf("WriteAt of 1 MiB = %d, %v, want 0, ENOSPC", n, err)
	}
	checkRead(t, m, want)

	src := randomBytes(2*rs, 7) // 512 KiB more: fits
	if err := m.Scatter([]int{14, 15}, src); err != nil {
		t.Fatalf("a scatter that fits: %v", err)
	}
	copy(want[14*rs:], src)
	checkRead(t, m, want)
}

// Helper processes: this test binary run again by proctest.Start, with
// envHelper saying what to do.
const (
	envHelper = "MEMMAP_TEST_HELPER" // "map-then-read"
	envPath   = "MEMMAP_TEST_PATH"   // the tensor's file: uint8 [helperRows, helperRowBytes]
	envGo     = "MEMMAP_TEST_GO"     // a file whose appearance says: read now
)

const helperRows, helperRowBytes = 8, 300_001

// TestHelperProcess is not a test: it is the body of the helper processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(envHelper) {
	case "map-then-read":
		if err := helperMapThenRead(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(3)
		}
		os.Exit(0)
	default:
		t.Skip("the body of a helper process")
	}
}

// helperMapThenRead maps the tensor at $PATH read-write, prints "mapped",
// waits for the file $GO to exist, then reads every row once through its
// mapping and prints "row R SHA256".
func helperMapThenRead() error {
	m, err := Open(os.Getenv(envPath), Uint8, []int{helperRows, helperRowBytes}, ReadWrite)
	if err != nil {
		return err
	}
	defer m.Close()
	fmt.Println("mapped")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(os.Getenv(envGo)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("no go file within 60 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	row := make([]byte, helperRowBytes)
	for r := range helperRows {
		if err := m.Gather(row, []int{r}); err != nil {
			return err
		}
		sum := sha256.Sum256(row)
		fmt.Println("row", r, hex.EncodeToString(sum[:]))
	}
	return nil
}

// TestTensor_ColdWriteSeenByAnotherProcess writes cold rows here while
// another process maps the file, and checks that its mapping shows them at
// once: no flush, no remapping.
func TestTensor_ColdWriteSeenByAnotherProcess(t *testing.T) {
	m := mustCreate(t, Uint8, helperRows, helperRowBytes)
	goFile := filepath.Join(t.TempDir(), "go")
	p := proctest.Start(t, envHelper+"=map-then-read", envPath+"="+m.Path(), envGo+"="+goFile)
	p.Expect(t, "mapped")
	if n := residentPages(t, m, 0, m.NumBytes()); n != 0 {
		t.Skipf("%d pages of a new file are cached (tmpfs?)", n)
	}
	rs := helperRowBytes
	want := make([]byte, m.NumBytes())
	if err := m.Fill([]int{1, 2}, []byte{0x5a}); err != nil {
		t.Fatal(err)
	}
	copy(want[rs:3*rs], bytes.Repeat([]byte{0x5a}, 2*rs))
	src := randomBytes(2*rs, 8)
	if err := m.Scatter([]int{5, 4}, src); err != nil {
		t.Fatal(err)
	}
	copy(want[5*rs:6*rs], src[:rs])
	copy(want[4*rs:5*rs], src[rs:])
	p6 := randomBytes(rs-1000, 9)
	if _, err := m.WriteAt(p6, int64(6*rs+500)); err != nil {
		t.Fatal(err)
	}
	copy(want[6*rs+500:], p6)

	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for r := range helperRows {
		got := p.Expect(t, "row "+strconv.Itoa(r)+" ")
		sum := sha256.Sum256(want[r*rs : (r+1)*rs])
		if !strings.EqualFold(got, hex.EncodeToString(sum[:])) {
			t.Errorf("row %d in the other process's mapping differs from what was written", r)
		}
	}
	if err := p.WaitFor(30 * time.Second); err != nil {
		t.Errorf("helper: %v", err)
	}
}

// TestTensor_InPlaceWritesThroughTheMapping checks InPlace's contract: a
// tensor marked in place writes cold pages through its mapping (a fault a
// page, as before pwrite writes existed), not with pwrite, and the bytes
// land all the same. The replay benchmark lost 18% of its samples for as
// long as it ran when its storage's first lap went by pwrite (2026-11-28).
func TestTensor_InPlaceWritesThroughTheMapping(t *testing.T) {
	const nrows, rs = 4, 1 << 20
	pages := nrows * rs / pageSize
	src := randomBytes(nrows*rs, 4)
	m := mustCreate(t, Uint8, nrows, rs)
	if n := residentPages(t, m, 0, m.NumBytes()); n != 0 {
		t.Skipf("%d pages of a new file are cached (tmpfs?)", n)
	}
	m.InPlace()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadFaults(t)
	err := m.Scatter([]int{0, 1, 2, 3}, src)
	faults := threadFaults(t) - before
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d page faults writing %d cold pages in place", faults, pages)
	if faults < int64(pages/4) {
		t.Errorf("writing %d cold pages in place took %d page faults: they did not go through the mapping", pages, faults)
	}
	checkFile(t, m, src)
}
