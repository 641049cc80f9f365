// Package shm owns the words that processes share through mapped files: it
// maps a shared file (create, open, grow, unmap), gives atomic access to its
// 32- and 64-bit words, sleeps on a 32-bit word until another process
// changes it (a futex on Linux, a bounded sleep-poll elsewhere), and guards
// accesses so that a file truncated under its mapping is an error, not a
// SIGBUS. serve's bell and rings and collective's control words and data
// segments are mapped here; internal/slots' seqlock uses its Fence and
// Reserve.
//
// # Mapping
//
// A Map maps a file shared (MAP_SHARED): read-write, or read-only for a
// file another process writes. Mapping is mmap-go's, the library memmap
// maps with, in this one file: a memmap.Tensor is a typed array behind a
// lock, with row copies, Flush and direct I/O, none of which a word needs,
// and its read-only mode is copy-on-write, which would charge every peer's
// multi-gigabyte segment to this process's commit limit. The file is not
// held open: a Map is the mapping alone.
//
// # Lifetimes
//
// A Map's words and Bytes alias the mapping and are valid until Close,
// which unmaps at once: the caller makes sure no goroutine still uses them
// (serve and collective count the requests in flight). There is no lock
// per access: a word's load is one instruction.
//
// # Faults
//
// Word accesses are not guarded, as memmap's Bytes is not: reading a word
// of a file truncated under its mapping raises SIGBUS. Code that touches a
// file another process may truncate runs under Map.Guard (memmap.Guard,
// naming the file), which turns the fault into an error wrapping
// memmap.ErrFault. Files this process made and keeps (its own control
// words) need no guard.
package shm

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/edsrzf/mmap-go"

	"github.com/tensorwire/tensorwire/memmap"
)

// Map is a mapped file of words that several processes share, or (Over)
// memory that one process's goroutines share the same way.
type Map struct {
	name string    // the file, for errors
	b    []byte    // the words
	mm   mmap.MMap // the mapping as MapRegion returned it; nil for Over
}

// Create makes the file path, which must not exist, of size bytes with
// permission perm, reserves its blocks (Grow) and maps it read-write,
// zero-filled. On an error after the file was made it is removed.
func Create(path string, size int, perm os.FileMode) (*Map, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: a map of %d bytes", size)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := func() (*Map, error) {
		if err := Grow(f, size); err != nil {
			return nil, err
		}
		return mapRegion(f, size, true)
	}()
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return m, nil
}

// Open opens the file path and maps it as MapFile does.
func Open(path string, size int, write bool) (*Map, error) {
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return MapFile(f, size, write)
}

// MapFile maps the first size bytes of f, shared: read-write if write (f
// open read-write), else read-only, seeing the writes of the processes
// that map it read-write. f must be a regular file of at least size bytes
// (else an error wrapping memmap.ErrShortFile): a mapping past the file's
// end faults where it is touched. f may be closed once MapFile returns.
func MapFile(f *os.File, size int, write bool) (*Map, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: a map of %d bytes of %s", size, f.Name())
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() < int64(size) {
		return nil, fmt.Errorf("%s: %w: %d bytes, want a regular file of %d", f.Name(), memmap.ErrShortFile, fi.Size(), size)
	}
	return mapRegion(f, size, write)
}

func mapRegion(f *os.File, size int, write bool) (*Map, error) {
	prot := mmap.RDONLY // PROT_READ, MAP_SHARED
	if write {
		prot = mmap.RDWR // PROT_READ|PROT_WRITE, MAP_SHARED
	}
	mm, err := mmap.MapRegion(f, size, prot, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes of %s: %w", size, f.Name(), err)
	}
	return &Map{name: f.Name(), b: mm, mm: mm}, nil
}

// Over returns a Map of b, memory the caller owns: a test's stand-in for a
// mapping, whose words work as a mapping's (Wait and Wake among this
// process's goroutines). Close does not free b. b must be 8-byte aligned.
func Over(b []byte) *Map {
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		panic("shm: Over of memory not 8-byte aligned")
	}
	return &Map{name: "memory", b: b}
}

// Grow reserves the blocks of f's first size bytes (Reserve) and sets its
// length to size: a write through a mapping into a hole of a full disk or
// tmpfs is a SIGBUS, a failed reservation an error now (wrapping ENOSPC).
func Grow(f *os.File, size int) error {
	if err := Reserve(f, int64(size)); err != nil {
		return err
	}
	return f.Truncate(int64(size))
}

// Bytes returns the mapped bytes. The slice is valid until Close.
func (m *Map) Bytes() []byte { return m.b }

// Len returns the number of bytes mapped.
func (m *Map) Len() int { return len(m.b) }

// Name returns the mapped file's name, as given when it was mapped.
func (m *Map) Name() string { return m.name }

// Close unmaps m. Its words and Bytes must no longer be used. Closing a nil
// or closed Map does nothing.
func (m *Map) Close() error {
	if m == nil || m.b == nil {
		return nil
	}
	m.b = nil
	if m.mm == nil {
		return nil
	}
	err := m.mm.Unmap()
	if err != nil {
		return fmt.Errorf("unmapping %s: %w", m.name, err)
	}
	return nil
}

// Guard runs fn under memmap.Guard: a fault inside it (m's file truncated
// under the mapping) is an error wrapping memmap.ErrFault that names m's
// file; fn's own error is returned as it is.
func (m *Map) Guard(fn func() error) error {
	err := memmap.Guard(fn)
	if err != nil && errors.Is(err, memmap.ErrFault) {
		return fmt.Errorf("%s: %w", m.name, err)
	}
	return err
}

// Uint32 returns the 32-bit word at byte offset off, which must be a
// multiple of 4 inside the map (else it panics: the layout is the
// caller's, a wrong offset a bug).
func (m *Map) Uint32(off int) *Uint32 {
	if off%4 != 0 || off < 0 || off > len(m.b)-4 {
		panic(fmt.Sprintf("shm: a 32-bit word at %d of a map of %d bytes", off, len(m.b)))
	}
	return (*Uint32)(unsafe.Pointer(&m.b[off]))
}

// Uint64 returns the 64-bit word at byte offset off, which must be a
// multiple of 8 inside the map (else it panics).
func (m *Map) Uint64(off int) *Uint64 {
	if off%8 != 0 || off < 0 || off > len(m.b)-8 {
		panic(fmt.Sprintf("shm: a 64-bit word at %d of a map of %d bytes", off, len(m.b)))
	}
	return (*Uint64)(unsafe.Pointer(&m.b[off]))
}

// noCopy makes go vet report a word copied by value: a copy is not shared.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// Uint32 is a 32-bit word of a Map, accessed atomically. Wait and Wake
// sleep on it and wake its sleepers, in any process that maps it.
type Uint32 struct {
	_ noCopy
	v uint32
}

// Load returns the word's value.
func (w *Uint32) Load() uint32 { return atomic.LoadUint32(&w.v) }

// Store sets the word's value.
func (w *Uint32) Store(v uint32) { atomic.StoreUint32(&w.v, v) }

// Add adds delta (^uint32(0) subtracts one) and returns the new value.
func (w *Uint32) Add(delta uint32) uint32 { return atomic.AddUint32(&w.v, delta) }

// CompareAndSwap sets the word to new if it holds old, and reports whether
// it did.
func (w *Uint32) CompareAndSwap(old, new uint32) bool {
	return atomic.CompareAndSwapUint32(&w.v, old, new)
}

// Wait sleeps while the word holds old, for d at most. It may return early
// (a signal, a Wake meant for another word, a spurious wake-up), so the
// caller loops on its own condition; it returns at once if the word does
// not hold old or d <= 0. A Wake on the word, from any process mapping it
// (from this process only, off Linux), ends the sleep.
func (w *Uint32) Wait(old uint32, d time.Duration) { wait(w, old, d) }

// Wake wakes every goroutine and process sleeping in Wait on the word. It
// does not touch the word's memory, so it is safe on a truncated file.
// Waking nobody costs a system call on Linux: callers that can keep a count
// of sleepers (a word of their own) wake only when it is not zero.
func (w *Uint32) Wake() { wake(w) }

// Uint64 is a 64-bit word of a Map, accessed atomically.
type Uint64 struct {
	_ noCopy
	v uint64
}

// Load returns the word's value.
func (w *Uint64) Load() uint64 { return atomic.LoadUint64(&w.v) }

// Store sets the word's value.
func (w *Uint64) Store(v uint64) { atomic.StoreUint64(&w.v, v) }

// Add adds delta and returns the new value.
func (w *Uint64) Add(delta uint64) uint64 { return atomic.AddUint64(&w.v, delta) }

// CompareAndSwap sets the word to new if it holds old, and reports whether
// it did.
func (w *Uint64) CompareAndSwap(old, new uint64) bool {
	return atomic.CompareAndSwapUint64(&w.v, old, new)
}

// fenceVar is the target of Fence's read-modify-write.
var fenceVar atomic.Uint32

// Fence orders the plain loads before it (a reader's copies out of a
// mapping) before the atomic loads after it (the words it checks). An
// atomic read-modify-write is a full barrier on every architecture Go
// supports; a plain atomic load is not on arm64, where earlier loads may
// complete after it.
func Fence() { fenceVar.Add(1) }
