package slots

import (
	"errors"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

// TestOpenReadOnly_IsShared: OpenReadOnly's contract is a shared, read-only
// mapping: a SetWord on it faults, and the reader keeps seeing the owner's
// writes. A copy-on-write mapping took the write silently and hid every
// later write of the owner to that page from the reader.
func TestOpenReadOnly_IsShared(t *testing.T) {
	path := filepath.Join(t.TempDir(), "slots")
	w, err := Create(path, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := OpenReadOnly(path, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Under the race detector a fault in an atomic store kills the
	// process (race_test.go): the stray write is left out there.
	faulted := raceEnabled || func() (f bool) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { f = recover() != nil }()
		r.SetWord(3, MakeWord(1, 1))
		return false
	}()
	w.SetWord(3, MakeWord(9, 2))
	if !faulted {
		t.Errorf("SetWord on a read-only table did not fault")
	}
	if got := r.Word(3); got != MakeWord(9, 2) {
		t.Errorf("the reader sees word %#x after the owner wrote %#x", got, MakeWord(9, 2))
	}
	if err := r.Flush(); err != nil {
		t.Errorf("Flush of a read-only table: %v", err)
	}
}

// TestOpen_OverflowingDims: a record count from a damaged description
// whose table size overflows is refused as a bad shape (memmap.ErrShape),
// not as a failed reservation of 0 or a negative number of bytes.
func TestOpen_OverflowingDims(t *testing.T) {
	path := filepath.Join(t.TempDir(), "slots")
	w, err := Create(path, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	for _, n := range []int{1 << 60, 1<<61 + 1} {
		for name, open := range map[string]func(string, int, int) (*Table, error){"Open": Open, "OpenReadOnly": OpenReadOnly} {
			tb, err := open(path, n, 2)
			if err == nil {
				tb.Close()
				t.Errorf("%s of %d records: no error", name, n)
			} else if !errors.Is(err, memmap.ErrShape) {
				t.Errorf("%s of %d records: %v, want memmap.ErrShape", name, n, err)
			}
		}
	}
}
