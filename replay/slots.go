package replay

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/tensorwire/tensorwire/memmap"
)

// SlotsFile is the name, under a buffer's prefix, of its slot table: one
// record of four little-endian uint64 per slot (docs/replay.md):
//
//	word      generation<<2 | state (stateEmpty, stateWriting, stateCommitted)
//	seq       insertion order: the reservation that last took the slot << 20
//	          | the row of its batch
//	priority  the raw priority, as float64 bits
//	key       the top-k writer's key, as float64 bits
//
// The buffer node is the only process that writes it. Clients in other
// processes map it too (shared, so they see the node's writes at once) but
// only read it, comparing words: a word that changed between the sample
// and the end of a gather means the row may be torn.
const SlotsFile = "slots.memmap"

// Slot states, the low two bits of a slot's word.
const (
	stateEmpty     = 0 // never written, or its reservation expired
	stateWriting   = 1 // reserved: a writer may be writing its row
	stateCommitted = 2 // holds a whole transition; may be sampled
)

const slotFields = 4

// slotTable is a mapped slot table. Its words are read and written with
// atomic operations, since other processes read them while the buffer node
// writes; the other fields are written only by the buffer node under its
// lock.
type slotTable struct {
	mm  *memmap.Tensor
	rec []uint64 // len = capacity * slotFields, aliases the mapping
}

// createSlots makes a zeroed slot table for capacity slots at path.
func createSlots(path string, capacity int) (*slotTable, error) {
	mm, err := memmap.Create(path, memmap.Uint64, capacity, slotFields)
	if err != nil {
		return nil, err
	}
	return newSlotTable(mm, capacity)
}

// openSlots maps the slot table at path, shared and read-write. It first
// reserves the file's blocks (on Linux; see reserve_other.go): its words are
// read and written through the mapping without a fault guard, so a file
// left sparse (a copy made with cp --sparse, rsync -S) on a full disk must
// be an error here rather than a SIGBUS later.
func openSlots(path string, capacity int) (*slotTable, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	if err := reserveBlocks(f, int64(capacity)*slotFields*8); err != nil {
		f.Close()
		return nil, fmt.Errorf("reserving the blocks of %s: %w", path, err)
	}
	mm, err := memmap.OpenFile(f, memmap.Uint64, []int{capacity, slotFields}, memmap.ReadWrite)
	if err != nil {
		f.Close()
		return nil, err
	}
	return newSlotTable(mm, capacity)
}

func newSlotTable(mm *memmap.Tensor, capacity int) (*slotTable, error) {
	b, err := mm.Bytes()
	if err != nil {
		mm.Close()
		return nil, err
	}
	n := capacity * slotFields
	if len(b) < n*8 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		mm.Close()
		return nil, fmt.Errorf("replay: slot table: %d bytes mapped, want %d aligned", len(b), n*8)
	}
	return &slotTable{mm: mm, rec: unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), n)}, nil
}

// word returns slot's word: generation<<2 | state.
func (t *slotTable) word(slot int) uint64 {
	return atomic.LoadUint64(&t.rec[slot*slotFields])
}

func (t *slotTable) setWord(slot int, w uint64) {
	atomic.StoreUint64(&t.rec[slot*slotFields], w)
}

// seq returns slot's insertion order: rid<<rowBits | row.
func (t *slotTable) seq(slot int) uint64 { return t.rec[slot*slotFields+1] }

// rid returns the reservation that last took slot.
func (t *slotTable) rid(slot int) uint64 { return t.seq(slot) >> rowBits }

func (t *slotTable) setSeq(slot int, rid uint64, row int) {
	t.rec[slot*slotFields+1] = rid<<rowBits | uint64(row)
}

// rowBits is how many low bits of a slot's seq hold its row in the batch,
// which bounds a batch to 1<<rowBits transitions.
const rowBits = 20

func (t *slotTable) priority(slot int) float64 {
	return math.Float64frombits(t.rec[slot*slotFields+2])
}

func (t *slotTable) setPriority(slot int, p float64) {
	t.rec[slot*slotFields+2] = math.Float64bits(p)
}

func (t *slotTable) key(slot int) float64 { return math.Float64frombits(t.rec[slot*slotFields+3]) }

func (t *slotTable) setKey(slot int, k float64) { t.rec[slot*slotFields+3] = math.Float64bits(k) }

func (t *slotTable) len() int { return len(t.rec) / slotFields }

func (t *slotTable) flush() error { return t.mm.Flush() }

func (t *slotTable) close() error { return t.mm.Close() }

// state and gen split a word.
func state(w uint64) uint64 { return w & 3 }
func gen(w uint64) uint64   { return w >> 2 }

// makeWord joins a generation and a state.
func makeWord(g, s uint64) uint64 { return g<<2 | s }

// fenceVar is the target of fence's read-modify-write.
var fenceVar atomic.Uint32

// fence orders the plain loads before it (a gather's copies) before the
// atomic loads after it (the words it checks). An atomic read-modify-write
// is a full barrier on every architecture Go supports; a plain atomic load
// is not on arm64, where earlier loads may complete after it.
func fence() { fenceVar.Add(1) }
