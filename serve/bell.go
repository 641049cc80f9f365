package serve

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/tensorwire/tensorwire/internal/shm"
)

// The bell: requests by reference without a network round trip.
//
// A client that shares the node's filesystem and runs on Linux has, beside
// its slots, a ring file (ClientsDir/ID/ring), and the node a bell file per
// served model (BellsDir/ID/bell). A request is one 8-byte entry the
// client appends to its ring: (first row, rows, sequence number). It then
// rings the node's bell: adds one to the bell's word and, if the node's
// poller sleeps on it, wakes it (futex). The poller reads every
// registered client's ring, runs each request through the manager as a
// call would, writes the outputs into the client's output slots and then
// the request's record (status, version, and last the sequence number
// done), and wakes the client waiting on that word. Nothing crosses a
// socket: a round trip is two futex wake-ups, a few microseconds, where a
// call over loopback TCP costs tens.
//
// Each ring has one producer (the client, under its own lock) and one
// consumer (the node's poller), so a client that dies mid-append harms
// only its own ring. The node reads a ring's words under a fault guard: a
// ring file truncated under it ends that client's registration, never the
// node. Errors travel by call: a record's status says the request failed,
// and the client asks serve.failure for the error itself.
//
// Ring file layout (little-endian, the words shared with atomic access):
//
//	0     tail: entries appended (client)
//	64    head: entries taken (node)
//	128   entries: slots x uint64, entry i at (i mod slots)
//	...   records, at the next multiple of 64: slots x 32 bytes, record s
//	      for the request whose first row is s:
//	      0 done (uint32): the sequence number of the last request done
//	      4 status (uint32): 0 ok, 1 failed (serve.failure says why)
//	      8 waiters (uint32): clients sleeping on done
//	      16 version (uint64): the parameter version that produced it
//
// The words are shm's (internal/shm): atomic, and the futex wait and wake
// of its Uint32.
//
// Bell file layout: 0 ring (uint32): rung once per request; 64 sleeping
// (uint32): 1 while the poller sleeps on ring. 4096 bytes.

// BellsDir is where, under the shared root, a node keeps the bells of the
// models it serves to clients by reference: BellsDir/ID/{bell,lock}. The
// node holds the lock while it runs; a client that finds a folder whose
// lock is free (its node died) removes it.
const BellsDir = ".tensorwire-serve/nodes"

const (
	ringTail    = 0
	ringHead    = 64
	ringEntries = 128
	recordSize  = 32
	bellRing    = 0
	bellSleep   = 64
	bellSize    = 4096
)

// ringSize returns the ring file's size for slots, and the offset of its
// records.
func ringSize(slots int) (size, records int) {
	records = (ringEntries + 8*slots + 63) &^ 63
	size = (records + recordSize*slots + 4095) &^ 4095
	return size, records
}

// Entry encoding: start (21 bits), n (21 bits), sequence (22 bits).
const (
	entrySeqBits = 22
	entryRowBits = 21
	entrySeqMask = 1<<entrySeqBits - 1
	entryRowMask = 1<<entryRowBits - 1
)

func makeEntry(start, n int, seq uint32) uint64 {
	return uint64(start)<<(entryRowBits+entrySeqBits) | uint64(n)<<entrySeqBits | uint64(seq&entrySeqMask)
}

func splitEntry(e uint64) (start, n int, seq uint32) {
	return int(e >> (entryRowBits + entrySeqBits) & entryRowMask), int(e >> entrySeqBits & entryRowMask), uint32(e & entrySeqMask)
}

// ringView is a mapped ring file.
type ringView struct {
	b       *shm.Map // the ring's mapping (shm.Over memory in FuzzBellRing)
	slots   int
	records int
}

func newRingView(m *shm.Map, slots int) (*ringView, error) {
	size, records := ringSize(slots)
	if m.Len() < size || uintptr(unsafe.Pointer(unsafe.SliceData(m.Bytes())))%64 != 0 {
		return nil, fmt.Errorf("a ring of %d bytes for %d slots; want %d", m.Len(), slots, size)
	}
	return &ringView{b: m, slots: slots, records: records}, nil
}

func (r *ringView) tail() *shm.Uint64 { return r.b.Uint64(ringTail) }
func (r *ringView) head() *shm.Uint64 { return r.b.Uint64(ringHead) }
func (r *ringView) entry(i uint64) *shm.Uint64 {
	return r.b.Uint64(ringEntries + 8*int(i%uint64(r.slots)))
}
func (r *ringView) done(s int) *shm.Uint32    { return r.b.Uint32(r.records + recordSize*s) }
func (r *ringView) status(s int) *shm.Uint32  { return r.b.Uint32(r.records + recordSize*s + 4) }
func (r *ringView) waiters(s int) *shm.Uint32 { return r.b.Uint32(r.records + recordSize*s + 8) }
func (r *ringView) version(s int) *shm.Uint64 { return r.b.Uint64(r.records + recordSize*s + 16) }

// createShared makes the file at path of size bytes, its blocks reserved
// (a write into a hole of a full tmpfs through a mapping is SIGBUS; a
// failed fallocate, an error now), zero-filled, and maps it.
func createShared(path string, size int) (*shm.Map, error) {
	if !bellSupported {
		return nil, errNoBell
	}
	return shm.Create(path, size, 0o644)
}

// openShared maps the file f, read-write and shared, checking it holds
// size bytes. The caller opened f (through the node's os.Root).
func openShared(f *os.File, size int) (*shm.Map, error) {
	if !bellSupported {
		return nil, errNoBell
	}
	return shm.MapFile(f, size, true)
}

// unmapShared unmaps m; nil does nothing.
func unmapShared(m *shm.Map) { m.Close() }

var errNoBell = errors.New("serve: shared-memory requests need Linux")
