package benchkit

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDropMappings_ColdAfterEvict checks the two-step eviction on a file
// mapped twice: fadvise alone leaves pages that a mapping still holds in
// the page cache; after DropMappings the same fadvise evicts them.
func TestDropMappings_ColdAfterEvict(t *testing.T) {
	const size = 16 << 12
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Repeat([]byte{7}, size)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	var maps [2][]byte
	for i := range maps {
		prot := unix.PROT_READ
		flags := unix.MAP_PRIVATE
		if i == 0 {
			prot, flags = unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED
		}
		if maps[i], err = unix.Mmap(int(f.Fd()), 0, size, prot, flags); err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(maps[i])
		FlushCache(maps[i][:]) // touch every page
	}
	fadvise := func() {
		if err := unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
	}
	fadvise()
	if res, pages, err := Resident(maps[0]); err != nil || pages != 16 {
		t.Fatalf("Resident = %d, %d, %v", res, pages, err)
	} else {
		t.Logf("after fadvise alone: %d of %d pages resident", res, pages)
	}
	n, err := DropMappings(maps[0][100:])
	if err != nil || n != 2 {
		t.Fatalf("DropMappings = %d, %v; want both mappings", n, err)
	}
	fadvise()
	if res, _, _ := Resident(maps[1]); res != 0 {
		t.Errorf("%d pages resident after DropMappings and fadvise", res)
	}
	if maps[0][size-1] != 7 || maps[1][0] != 7 {
		t.Error("data changed")
	}
	if _, err := DropMappings(make([]byte, 8)); err == nil {
		t.Error("DropMappings accepted heap memory")
	}
}
