package memmap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/edsrzf/mmap-go"
	"github.com/tensorwire/tensorwire/internal/atomicfile"
)

// Mode says how Open maps a file.
type Mode int

const (
	// ReadOnly maps the file copy-on-write: Gather and ReadAt work, Scatter and
	// WriteAt return ErrReadOnly, and writes through the slice from Bytes (or
	// a view of it) stay private to this process instead of crashing it. On
	// Windows the mapping is read-only instead, and such a write faults (see
	// readOnlyProt).
	ReadOnly Mode = iota
	// ReadWrite maps the file shared: writes reach the file and every other
	// process that maps it.
	ReadWrite
)

func (m Mode) String() string {
	if m == ReadWrite {
		return "read-write"
	}
	return "read-only"
}

// Tensor is an n-dimensional array of one DType in a memory-mapped file. See
// the package documentation for lifetimes, concurrency and durability.
type Tensor struct {
	path     string
	dtype    DType
	shape    []int
	size     int // bytes of data: NumBytes(dtype, shape)
	rowSize  int
	writable bool

	mu       sync.RWMutex // read-locked by every access, write-locked by Close
	f        *os.File
	data     mmap.MMap // the mapping exactly as MapRegion returned it (Unmap needs it); nil if size is 0
	closed   bool
	pins     atomic.Int32 // GatherTo calls in flight, which keep the mapping without the lock (pin)
	released bool         // the mapping and the file are let go: at Close, or at the last unpin after it; under mu

	direct direct // how writes may bypass the mapping (direct_linux.go); set by mapFile
}

// Create makes a zero-filled file at path for an array of dtype dt and shape
// shape, reserves its disk blocks, and maps it read-write.
//
// The file is built under a temporary name in the same directory and renamed
// into place, so an existing file at path is replaced whole: a process that
// still maps the old file keeps its old bytes instead of faulting. A disk too
// full for the file is an error here, not a SIGBUS later. Any name the file
// system takes for the file itself works, however near its length limit
// (see createTemp).
func Create(path string, dt DType, shape ...int) (*Tensor, error) {
	return create(path, dt, shape, true)
}

// CreateUnsynced is Create without the fsync of path's folder once the
// file is in place: every process sees the file at once, but a crash may
// lose it until the folder is synced. It is for a caller that makes a
// whole folder of new files durable at once after writing into them
// (tensordict's Unsynced writes, then its SyncPrefix), one sync a file and
// folder instead of several.
func CreateUnsynced(path string, dt DType, shape ...int) (*Tensor, error) {
	return create(path, dt, shape, false)
}

func create(path string, dt DType, shape []int, sync bool) (*Tensor, error) {
	size, err := NumBytes(dt, shape)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := createTemp(dir, base)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) (*Tensor, error) {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := reserve(f, int64(size)); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if sync {
		if err := atomicfile.SyncDir(dir); err != nil {
			f.Close()
			return nil, fmt.Errorf("create %s: %w", path, err)
		}
	}
	t, err := mapFile(f, path, dt, shape, size, ReadWrite)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	return t, nil
}

// maxName is the longest file name, in bytes, that the usual file systems
// take: ext4's, XFS's, Btrfs's, APFS's (NTFS counts 255 UTF-16 units, never
// more than the UTF-8 bytes).
const maxName = 255

// createTemp creates the temporary file that create builds base's file
// under, in dir: "."+base+".tmp-" and up to 10 random digits, so that a
// crash's leftover says whose it is (importer recognises
// ".<key>.memmap.tmp-*" in a dataset's folder as one), or ".tmp-" and the
// digits when that name, 16 bytes longer than base, would not fit where
// base does: over maxName bytes, or refused as too long (ENAMETOOLONG: a
// file system with a lower limit).
func createTemp(dir, base string) (*os.File, error) {
	if len(base)+len("."+".tmp-")+10 <= maxName {
		f, err := os.CreateTemp(dir, "."+base+".tmp-*")
		if !errors.Is(err, syscall.ENAMETOOLONG) {
			return f, err
		}
	}
	return os.CreateTemp(dir, ".tmp-*")
}

// Open maps an existing file holding an array of dtype dt and shape shape.
// The file may be longer than the array needs (the rest is ignored); a
// shorter one is an error wrapping ErrShortFile.
func Open(path string, dt DType, shape []int, mode Mode) (*Tensor, error) {
	flag := os.O_RDONLY
	if mode == ReadWrite {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	t, err := OpenFile(f, dt, shape, mode)
	if err != nil {
		f.Close()
		return nil, err
	}
	return t, nil
}

// OpenFile maps f, already open (read-write for ReadWrite), as Open does a
// path: the file must be regular and hold at least the shape's bytes. On
// success the Tensor owns f and closes it on Close; on error f is left open
// for the caller. It exists for callers that open files their own way, such
// as through an os.Root that keeps paths inside a directory.
func OpenFile(f *os.File, dt DType, shape []int, mode Mode) (*Tensor, error) {
	path := f.Name()
	size, err := NumBytes(dt, shape)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open %s: not a regular file", path)
	}
	if fi.Size() < int64(size) {
		return nil, fmt.Errorf("open %s: %w: %d bytes, %v %v needs %d",
			path, ErrShortFile, fi.Size(), dt, shape, size)
	}
	t, err := mapFile(f, path, dt, shape, size, mode)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return t, nil
}

func mapFile(f *os.File, path string, dt DType, shape []int, size int, mode Mode) (*Tensor, error) {
	t := &Tensor{
		path:     path,
		dtype:    dt,
		shape:    slices.Clone(shape),
		size:     size,
		rowSize:  RowBytes(dt, shape),
		writable: mode == ReadWrite,
		f:        f,
	}
	if size == 0 {
		return t, nil // mmap of zero bytes is an error; there is nothing to map
	}
	prot := mmap.RDWR // MAP_SHARED: writes reach the file
	if mode != ReadWrite {
		prot = readOnlyProt
	}
	data, err := mmap.MapRegion(f, size, prot, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	t.data = data
	t.initDirect()
	return t, nil
}

// readOnlyProt is how ReadOnly maps: copy-on-write (MAP_PRIVATE), so that a
// stray write through a view stays in this process. On Windows it is
// read-only: mmap-go's Unmap there flushes a copy-on-write view's file
// buffers, which fails for a file opened read-only and leaves the view
// mapped.
var readOnlyProt = func() int {
	if runtime.GOOS == "windows" {
		return mmap.RDONLY
	}
	return mmap.COPY
}()

// writeZeros reserves f's blocks the portable way: by writing size zero
// bytes from offset 0. f must be empty or at most size bytes long.
func writeZeros(f *os.File, size int64) error {
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zeros)) {
		n := min(int64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return fmt.Errorf("reserve %d bytes: %w", size, err)
		}
	}
	return nil
}

// Path returns the file name the tensor was created or opened with.
func (t *Tensor) Path() string { return t.path }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Shape returns a copy of the shape.
func (t *Tensor) Shape() []int { return slices.Clone(t.shape) }

// Len returns the number of rows (the first dimension), or 0 for a scalar.
func (t *Tensor) Len() int {
	if len(t.shape) == 0 {
		return 0
	}
	return t.shape[0]
}

// RowBytes returns the byte size of one row, or 0 for a scalar.
func (t *Tensor) RowBytes() int { return t.rowSize }

// NumBytes returns the byte size of the data (the file may be longer).
func (t *Tensor) NumBytes() int { return t.size }

// Writable reports whether the tensor was mapped read-write.
func (t *Tensor) Writable() bool { return t.writable }

// Bytes returns the mapped data as a byte slice, for zero-copy I/O (a
// network write, a hash) and for views such as tensordict's Dense. It aliases
// the mapping and is valid only until Close; accesses through it are not
// guarded against faults.
func (t *Tensor) Bytes() ([]byte, error) {
	if err := t.acquire(false); err != nil {
		return nil, err
	}
	defer t.mu.RUnlock()
	return t.data[:t.size:t.size], nil
}

// Close unmaps the file and closes it, after the calls in flight return. It
// does not flush: call Flush first for durability (on Windows, mmap-go's
// Unmap flushes the view as it unmaps; elsewhere it does not). Slices from
// Bytes become invalid. Closing a closed Tensor returns nil.
//
// A GatherTo in flight does not hold Close up: it may be waiting for a slow
// peer to take its bytes, so the mapping stays until it returns and is let
// go then (an error unmapping it then is not reported). Every other call
// is waited for.
func (t *Tensor) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	if t.pins.Load() > 0 {
		return nil // the last unpin lets go
	}
	if err := t.release(); err != nil {
		return fmt.Errorf("close %s: %w", t.path, err)
	}
	return nil
}

// release unmaps the file and closes it. The caller holds t.mu locked.
func (t *Tensor) release() error {
	t.released = true
	var err error
	if t.data != nil {
		err = t.data.Unmap() // on the slice MapRegion returned, as mmap-go requires
	}
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// pin keeps t's mapping until unpin, without holding t.mu: for a call that
// may wait on someone else while it reads the mapping (GatherTo's writer).
// Close during a pin does not wait for it: the last unpin lets the mapping
// go. It returns ErrClosed (wrapped) after Close. (A pin is taken under the
// read lock and Close reads the pins under the write lock, so no pin is
// taken after Close has looked.)
func (t *Tensor) pin() error {
	if err := t.acquire(false); err != nil {
		return err
	}
	t.pins.Add(1)
	t.mu.RUnlock()
	return nil
}

// unpin ends a pin; the last one after Close lets the mapping go.
func (t *Tensor) unpin() {
	if t.pins.Add(-1) > 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed && !t.released && t.pins.Load() == 0 {
		t.release()
	}
}

// acquire read-locks t for an access. It returns ErrClosed (wrapped) after
// Close, and ErrReadOnly when write is set on a read-only tensor; on success
// the caller must call t.mu.RUnlock.
func (t *Tensor) acquire(write bool) error {
	t.mu.RLock()
	if t.closed {
		t.mu.RUnlock()
		return fmt.Errorf("%s: %w", t.path, ErrClosed)
	}
	if write && !t.writable {
		t.mu.RUnlock()
		return fmt.Errorf("%s: %w", t.path, ErrReadOnly)
	}
	return nil
}
