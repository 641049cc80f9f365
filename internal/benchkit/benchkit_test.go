package benchkit

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPickRows_Distinct(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]int, 5)
	for range 1000 {
		PickRows(rng, 6, rows)
		s := slices.Clone(rows)
		slices.Sort(s)
		if len(slices.Compact(s)) != 5 || s[0] < 0 || s[4] >= 6 {
			t.Fatalf("rows %v are not 5 distinct indices in [0, 6)", rows)
		}
	}
}

func TestBuffers(t *testing.T) {
	if b := Touched(4097); !bytes.Equal(b, bytes.Repeat([]byte{0x5a}, 4097)) {
		t.Error("Touched did not write every byte")
	}
	a, err := Anon(8192)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, bytes.Repeat([]byte{0xa5}, 8192)) {
		t.Error("Anon did not write every byte")
	}
	FlushCache(a)
	if err := Free(a); err != nil {
		t.Fatal(err)
	}
}

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

func TestOnInterrupt_CancelsOnSignal(t *testing.T) {
	ctx, stop := OnInterrupt("test: interrupted")
	defer stop()
	if err := unix.Kill(os.Getpid(), unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("SIGTERM did not cancel the context in 30 s")
	}
	ctx2, stop2 := OnInterrupt("unused")
	stop2()
	if ctx2.Err() == nil {
		t.Error("stop did not cancel the context")
	}
}

func TestCheckRow(t *testing.T) {
	for _, tc := range []struct {
		row  []byte
		want byte
		ok   bool
	}{
		{[]byte{7, 7, 7}, 7, true},
		{[]byte{}, 7, true},
		{[]byte{7, 6, 7}, 7, false},
		{[]byte{0, 0, 1}, 0, false},
	} {
		err := CheckRow(3, tc.row, tc.want)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrMismatch)) {
			t.Errorf("CheckRow(%v, %d) = %v", tc.row, tc.want, err)
		}
	}
	if err := CheckRow(3, []byte{7, 6}, 7); err == nil || !strings.Contains(err.Error(), "row 3 byte 1 is 6, want 7") {
		t.Errorf("error %v does not name the first differing byte", err)
	}
}
