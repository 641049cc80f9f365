package replay

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestBuffer_StorageWritesInPlace checks that a buffer's storage is
// written through its mapping even where its pages are not in the page
// cache yet (tensordict.InPlace), not with pwrite: a first lap written with
// pwrite left the replay benchmark 18% slower at sampling for as long as it
// ran (2026-11-28, bisected to the pwrite path; docs/benchmarks.md). Through
// the mapping, each new page faults once in the writing thread.
func TestBuffer_StorageWritesInPlace(t *testing.T) {
	const rows, rowBytes = 8, 256 << 10
	schema := tensordict.RowSchema{{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{rowBytes}}}
	b := create(t, Config{Capacity: rows, Schema: schema})
	src := make([]uint8, rows*rowBytes)
	for i := range src { // touched: the source's own first faults are not counted
		src[i] = uint8(i)
	}
	obs, err := tensordict.FromSlice(src, rows, rowBytes)
	if err != nil {
		t.Fatal(err)
	}
	td, err := tensordict.New(rows)
	if err != nil {
		t.Fatal(err)
	}
	if err := td.Set("obs", obs); err != nil {
		t.Fatal(err)
	}
	pages := rows * rowBytes / unix.Getpagesize()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadFaults(t)
	if _, err := b.Extend(ctxT(t), td); err != nil {
		t.Fatal(err)
	}
	faults := threadFaults(t) - before
	t.Logf("%d page faults writing %d new pages of storage", faults, pages)
	if faults < int64(pages/4) {
		t.Errorf("writing %d new pages of storage took %d page faults: the rows did not go through the mapping (pwrite?)", pages, faults)
	}
}

// threadFaults returns the page faults of the calling thread so far.
func threadFaults(t *testing.T) int64 {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt + ru.Majflt
}
