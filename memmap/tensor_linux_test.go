package memmap

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Tests of what memmap does on Linux only: fallocate, mincore, eviction.

func TestCreate_ReservesBlocks(t *testing.T) {
	m := mustCreate(t, Float32, 100, 7)
	var st unix.Stat_t
	if err := unix.Stat(m.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 < int64(m.NumBytes()) {
		t.Errorf("file is sparse: %d bytes allocated for %d", st.Blocks*512, m.NumBytes())
	}
}

// TestWriteZeros_ReservesBlocks checks the fallback that reserve uses
// without fallocate (and on every system but Linux): the zeros it writes
// allocate the file's blocks.
func TestWriteZeros_ReservesBlocks(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "z"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 3<<20 + 5 // more than one 1 MiB write, not a whole number of them
	if err := writeZeros(f, size); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 < size {
		t.Errorf("after writeZeros: size %d, %d bytes allocated; want %d of each", st.Size, st.Blocks*512, size)
	}
}

func TestCreate_FullDiskIsAnErrorAtCreation(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a small tmpfs to fill (needs root): %v", err)
	}
	defer unix.Unmount(dir, 0)
	_, err := Create(filepath.Join(dir, "big.memmap"), Uint8, 4<<20)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("creating 4 MiB on a 1 MiB disk: err = %v, want ENOSPC", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed create left %d files behind", len(entries))
	}
	m, err := Create(filepath.Join(dir, "small.memmap"), Uint8, 512<<10)
	if err != nil {
		t.Fatalf("a tensor that fits: %v", err)
	}
	defer m.Close()
	if err := m.Fill([]int{0}, []byte{1}); err != nil { // touches every page: reserved, no SIGBUS
		t.Fatal(err)
	}
}

func TestMincore_SeesEviction(t *testing.T) {
	m := mustCreate(t, Uint8, 4, prefetchMin)
	if err := m.Fill([]int{0, 1, 2, 3}, []byte{1}); err != nil {
		t.Fatal(err)
	}
	vec := make([]byte, 1)
	if err := mincore(m.data[:1], vec); err != nil || vec[0]&1 == 0 {
		t.Fatalf("a page just written is not resident: %v %v", vec, err)
	}
	if err := m.Evict(); err != nil {
		t.Fatal(err)
	}
	if err := mincore(m.data[:1], vec); err != nil || vec[0]&1 != 0 {
		t.Fatalf("a page after Evict is resident: %v %v", vec, err)
	}
	// Prefetched cold rows read back the bytes written before the eviction.
	got := make([]byte, 2*m.RowBytes())
	if err := m.Gather(got, []int{3, 0}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{1}, len(got))) {
		t.Error("rows gathered cold differ from what was written")
	}
}
