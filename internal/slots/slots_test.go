package slots

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTable_SharedBetweenMappings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "slots.memmap")
	w, err := Create(path, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	r, err := OpenReadOnly(path, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if r.Len() != 8 || r.Fields() != 3 {
		t.Fatalf("Len, Fields = %d, %d; want 8, 3", r.Len(), r.Fields())
	}
	w.SetWord(5, MakeWord(7, 2))
	w.SetField(5, 2, 42)
	Fence()
	if got := r.Word(5); Gen(got) != 7 || State(got) != 2 {
		t.Errorf("reader sees word %#x; want generation 7, state 2", got)
	}
	if got := r.Field(5, 2); got != 42 {
		t.Errorf("reader sees field %d; want 42", got)
	}
	if got := r.Word(4); got != 0 {
		t.Errorf("untouched slot's word = %#x; want 0", got)
	}
	rw, err := Open(path, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if got := rw.Field(5, 2); got != 42 {
		t.Errorf("reopened read-write: field = %d; want 42", got)
	}
}

func TestTable_Refusals(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, make([]byte, 8*3*4), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		open func() (*Table, error)
	}{
		{"no records", func() (*Table, error) { return Create(filepath.Join(dir, "a"), 0, 4) }},
		{"no fields", func() (*Table, error) { return Create(filepath.Join(dir, "b"), 4, 0) }},
		{"missing", func() (*Table, error) { return Open(filepath.Join(dir, "missing"), 4, 4) }},
		{"missing read-only", func() (*Table, error) { return OpenReadOnly(filepath.Join(dir, "missing"), 4, 4) }},
		{"short file read-only", func() (*Table, error) { return OpenReadOnly(short, 8, 3) }},
	} {
		if tb, err := tc.open(); err == nil {
			tb.Close()
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestMakeWord(t *testing.T) {
	for _, tc := range []struct{ gen, state uint64 }{{0, 0}, {1, 1}, {1 << 40, 2}, {3, 3}} {
		w := MakeWord(tc.gen, tc.state)
		if Gen(w) != tc.gen || State(w) != tc.state {
			t.Errorf("MakeWord(%d, %d) = %#x splits into %d, %d", tc.gen, tc.state, w, Gen(w), State(w))
		}
	}
}

// TestOpen_ShortFileRefusedUntouched: a table file shorter than the table
// asked for (a capacity from a damaged or hostile description) is refused,
// and left as it was: Open used to reserve the whole table first, growing
// the file (FuzzOpen took 3.2 GB of disk with a capacity of 100,000,000,
// and CI's fuzz step ran out of space).
func TestOpen_ShortFileRefusedUntouched(t *testing.T) {
	path := filepath.Join(t.TempDir(), "slots")
	if err := os.WriteFile(path, make([]byte, 40), 0o644); err != nil {
		t.Fatal(err)
	}
	if tb, err := Open(path, 1<<20, 4); err == nil {
		tb.Close()
		t.Fatal("a 40-byte table opened as 1<<20 records")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 40 {
		t.Fatalf("the refused table's file is %d bytes now, want the 40 it held", fi.Size())
	}
}
