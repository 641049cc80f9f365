// Package slots is a table of slots in a shared mapping: a fixed number of
// records of uint64 words in a file that several processes map, each
// record opened by a word holding the slot's generation and state. It is
// the seqlock that replay's buffer and loader's batch ring share.
//
// One process, the table's owner, writes it; others map it and read the
// words. A writer taking a slot raises its generation (MakeWord(Gen(w)+1,
// ...)) before it changes what the slot refers to, and sets the final state
// once the slot's data is whole. A reader that copies a slot's data reads
// the word before (from its owner's announcement or the table), copies,
// calls Fence, and reads the word again: an unchanged word means the copy
// is whole; a changed one means the slot was taken while it copied.
//
// Words are read and written with atomic operations (Word, SetWord:
// internal/shm's words over the table's memmap mapping); the other fields
// of a record (Field, SetField) are plain memory, which readers in other
// processes read only under the word's check.
package slots

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/memmap"
)

// Table is a mapped slot table of Len records of Fields words each. A
// Table's methods may be called from many goroutines; the words are
// atomic, the other fields are the caller's to guard.
type Table struct {
	mm     *memmap.Tensor // nil for OpenReadOnly's table, which words maps
	words  *shm.Map       // the mapping's bytes, for the atomic words
	rec    []uint64       // len = n * fields, aliases the mapping
	fields int
}

// Create makes a zeroed table of n records of fields words at path (which
// must not exist), its blocks reserved, mapped read-write.
func Create(path string, n, fields int) (*Table, error) {
	if _, err := checkDims(n, fields); err != nil {
		return nil, err
	}
	mm, err := memmap.Create(path, memmap.Uint64, n, fields)
	if err != nil {
		return nil, err
	}
	return newTable(mm, n, fields)
}

// Open maps the table at path read-write, shared. It first reserves the
// file's blocks (on Linux; shm.Reserve does nothing elsewhere): the words are read and
// written through the mapping without a fault guard, so a file left sparse
// (a copy made with cp --sparse, rsync -S) on a full disk must be an error
// here rather than a SIGBUS later.
func Open(path string, n, fields int) (*Table, error) {
	size, err := checkDims(n, fields)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	// A file shorter than the table is refused before anything is
	// reserved: Reserve grows a short file, and a capacity read from a
	// damaged or hostile description (FuzzOpen: 100,000,000) would take
	// gigabytes of disk before the mapping's check.
	if fi, err := f.Stat(); err != nil || fi.Size() < size {
		f.Close()
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("slots: %s holds %d bytes, want %d (%d records of %d words)", path, fi.Size(), size, n, fields)
	}
	if err := shm.Reserve(f, size); err != nil {
		f.Close()
		return nil, err
	}
	mm, err := memmap.OpenFile(f, memmap.Uint64, []int{n, fields}, memmap.ReadWrite)
	if err != nil {
		f.Close()
		return nil, err
	}
	return newTable(mm, n, fields)
}

// OpenReadOnly maps the table at path read-only, shared: the mapping of a
// reader, which sees the owner's writes at once and can make none (a
// SetWord or SetField on it faults). Reading a hole of a sparse file
// reads zeros, so no reservation is needed.
//
// It is shm's mapping (PROT_READ, MAP_SHARED), not memmap's ReadOnly, which
// is copy-on-write: a stray write there would be kept silently, and the
// page it copied would no longer show the owner's writes.
func OpenReadOnly(path string, n, fields int) (*Table, error) {
	size, err := checkDims(n, fields)
	if err != nil {
		return nil, err
	}
	m, err := shm.Open(path, int(size), false)
	if err != nil {
		return nil, err
	}
	b := m.Bytes()
	return &Table{words: m, rec: unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), n*fields), fields: fields}, nil
}

// checkDims returns the byte size of a table of n records of fields words,
// refusing a size that overflows (memmap.ErrShape).
func checkDims(n, fields int) (int64, error) {
	if n <= 0 || fields <= 0 {
		return 0, fmt.Errorf("slots: a table of %d records of %d words", n, fields)
	}
	size, err := memmap.NumBytes(memmap.Uint64, []int{n, fields})
	if err != nil {
		return 0, fmt.Errorf("slots: a table of %d records of %d words: %w", n, fields, err)
	}
	return int64(size), nil
}

func newTable(mm *memmap.Tensor, n, fields int) (*Table, error) {
	b, err := mm.Bytes()
	if err != nil {
		mm.Close()
		return nil, err
	}
	words := n * fields
	if len(b) < words*8 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		mm.Close()
		return nil, fmt.Errorf("slots: %d bytes mapped, want %d aligned", len(b), words*8)
	}
	return &Table{mm: mm, words: shm.Over(b[:words*8]), rec: unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), words), fields: fields}, nil
}

// Word returns slot's word, generation<<2 | state, atomically.
func (t *Table) Word(slot int) uint64 { return t.words.Uint64(8 * slot * t.fields).Load() }

// SetWord stores slot's word atomically.
func (t *Table) SetWord(slot int, w uint64) { t.words.Uint64(8 * slot * t.fields).Store(w) }

// Field returns word f (1 <= f < Fields) of slot's record, a plain load.
func (t *Table) Field(slot, f int) uint64 { return t.rec[slot*t.fields+f] }

// SetField stores word f (1 <= f < Fields) of slot's record, a plain store.
func (t *Table) SetField(slot, f int, v uint64) { t.rec[slot*t.fields+f] = v }

// Len returns the number of slots.
func (t *Table) Len() int { return len(t.rec) / t.fields }

// Fields returns the number of words per record, the word included.
func (t *Table) Fields() int { return t.fields }

// Flush writes the table's dirty pages to its file (msync); fsync for
// durability against a machine crash is the caller's.
func (t *Table) Flush() error {
	if t.mm == nil {
		return nil // read-only: nothing to write
	}
	return t.mm.Flush()
}

// Close unmaps the table. No method may be called after it.
func (t *Table) Close() error {
	if t.mm == nil {
		return t.words.Close()
	}
	return t.mm.Close()
}

// State returns the low two bits of a word: the slot's state, whose
// meaning is the owner's.
func State(w uint64) uint64 { return w & 3 }

// Gen returns a word's generation.
func Gen(w uint64) uint64 { return w >> 2 }

// MakeWord joins a generation and a state (0 to 3).
func MakeWord(gen, state uint64) uint64 { return gen<<2 | state&3 }

// Fence orders the plain loads before it (a reader's copies) before the
// atomic loads after it (the words it checks): shm.Fence.
func Fence() { shm.Fence() }
