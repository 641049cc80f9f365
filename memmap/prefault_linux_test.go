package memmap

import (
	"bufio"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// rssKB returns the Rss of this process's mapping that starts at addr, from
// /proc/self/smaps: the pages of it in this process's page tables.
func rssKB(t *testing.T, addr uintptr) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	found := false
	for sc.Scan() {
		line := sc.Text()
		if !found {
			rng, _, _ := strings.Cut(line, " ")
			start, _, ok := strings.Cut(rng, "-")
			if a, err := strconv.ParseUint(start, 16, 64); ok && err == nil && uintptr(a) == addr {
				found = true
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, "Rss:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("smaps: %q", line)
			}
			return kb
		}
	}
	t.Fatalf("no mapping at %#x in /proc/self/smaps", addr)
	return 0
}

// TestPrefault_MapsEveryPage: a fresh mapping of a file has none of its
// pages in this process's page tables; after Prefault it has all of them,
// and the bytes are the file's, in both modes.
func TestPrefault_MapsEveryPage(t *testing.T) {
	const rows, cols = 256, 4096 // 4 MiB of uint8
	for _, mode := range []Mode{ReadOnly, ReadWrite} {
		t.Run(mode.String(), func(t *testing.T) {
			m := mustCreate(t, Uint8, rows, cols)
			want := make([]byte, cols)
			for i := range want {
				want[i] = byte(i * 7)
			}
			if _, err := m.WriteAt(want, int64(cols*(rows-1))); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(); err != nil {
				t.Fatal(err)
			}
			o, err := Open(m.Path(), Uint8, []int{rows, cols}, mode)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			b, err := o.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			addr := uintptr(unsafe.Pointer(&b[0]))
			if kb := rssKB(t, addr); kb != 0 {
				t.Fatalf("a fresh mapping has %d kB in the page tables before Prefault, want 0", kb)
			}
			err = o.Prefault()
			if errors.Is(err, errors.ErrUnsupported) {
				t.Skipf("this kernel: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			if kb, all := rssKB(t, addr), rows*cols/1024; kb != all {
				t.Errorf("after Prefault %d kB of the mapping are in the page tables, want all %d", kb, all)
			}
			if got := b[cols*(rows-1):]; string(got) != string(want) {
				t.Errorf("the last row changed: %v", got[:8])
			}
			o.Close()
			if err := o.Prefault(); !errors.Is(err, ErrClosed) {
				t.Errorf("Prefault after Close: %v, want ErrClosed", err)
			}
		})
	}
}
