package replay

import (
	"math"

	"github.com/tensorwire/tensorwire/internal/slots"
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

// slotTable is a buffer's slot table (internal/slots): the word is read
// and written atomically, since other processes read it while the buffer
// node writes; the other fields are written only by the buffer node under
// its lock.
type slotTable struct {
	t *slots.Table
}

// createSlots makes a zeroed slot table for capacity slots at path.
func createSlots(path string, capacity int) (*slotTable, error) {
	t, err := slots.Create(path, capacity, slotFields)
	if err != nil {
		return nil, err
	}
	return &slotTable{t}, nil
}

// openSlots maps the slot table at path, shared and read-write, after
// reserving its blocks (slots.Open).
func openSlots(path string, capacity int) (*slotTable, error) {
	t, err := slots.Open(path, capacity, slotFields)
	if err != nil {
		return nil, err
	}
	return &slotTable{t}, nil
}

// word returns slot's word: generation<<2 | state.
func (t *slotTable) word(slot int) uint64 { return t.t.Word(slot) }

func (t *slotTable) setWord(slot int, w uint64) { t.t.SetWord(slot, w) }

// seq returns slot's insertion order: rid<<rowBits | row.
func (t *slotTable) seq(slot int) uint64 { return t.t.Field(slot, 1) }

// rid returns the reservation that last took slot.
func (t *slotTable) rid(slot int) uint64 { return t.seq(slot) >> rowBits }

func (t *slotTable) setSeq(slot int, rid uint64, row int) {
	t.t.SetField(slot, 1, rid<<rowBits|uint64(row))
}

// rowBits is how many low bits of a slot's seq hold its row in the batch,
// which bounds a batch to 1<<rowBits transitions.
const rowBits = 20

func (t *slotTable) priority(slot int) float64 { return math.Float64frombits(t.t.Field(slot, 2)) }

func (t *slotTable) setPriority(slot int, p float64) { t.t.SetField(slot, 2, math.Float64bits(p)) }

func (t *slotTable) key(slot int) float64 { return math.Float64frombits(t.t.Field(slot, 3)) }

func (t *slotTable) setKey(slot int, k float64) { t.t.SetField(slot, 3, math.Float64bits(k)) }

func (t *slotTable) len() int { return t.t.Len() }

func (t *slotTable) flush() error { return t.t.Flush() }

func (t *slotTable) close() error { return t.t.Close() }

// state and gen split a word.
func state(w uint64) uint64 { return slots.State(w) }
func gen(w uint64) uint64   { return slots.Gen(w) }

// makeWord joins a generation and a state.
func makeWord(g, s uint64) uint64 { return slots.MakeWord(g, s) }

// fence orders a gather's copies before the word checks after it
// (slots.Fence).
func fence() { slots.Fence() }
