package memmap

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// Writing cold pages with pwrite.
//
// A write through the mapping to a page that is not in the page cache
// faults, once per 4 KiB page: the kernel reads the page from the disk
// (even when the write then covers all of it), maps it, and the copy goes
// on. A 1.2 MB row is 300 faults. pwrite on the file puts the same bytes in
// the same page cache without mapping anything, and does not read the
// pages it covers whole. On Linux the page cache is what every MAP_SHARED
// mapping of the file shows, so every process that maps the file, this one
// included, sees the bytes at once, exactly as after a write through the
// mapping; Flush's msync and fsync write them back like any other dirty
// page.
//
// So ScatterAt, FillAt and WriteAt split their work into runs of
// consecutive rows (contiguous bytes of the file: one run for WriteAt), ask
// mincore which pages of each run are in the page cache, and write each
// stretch of pages that are not with pwrite (pwritev of a repeated pattern
// for a fill), and each stretch that is through the mapping, where a copy
// costs no syscall. Residency is known per page, so a row that spans
// resident and non-resident pages is written partly each way; either way
// exactly the row's bytes are written, never the rest of an edge page it
// shares with its neighbours. Runs shorter than directMin skip the mincore
// call and go through the mapping, as before.
//
// The order of the writes is the order of the rows (a repeated row splits
// runs), so when a row repeats the last copy still wins.

// directMin is the smallest run of bytes for which a write asks mincore:
// below it, the syscall costs more than the page faults pwrite could save.
const directMin = 64 << 10

// vecPages is how many pages one mincore call covers (the residency vector
// lives on the stack): 4 MiB of data with 4 KiB pages.
const vecPages = 1024

// patternBytes is the length of the repeated element that pwritev sends for
// a fill, and maxIovecs how many of them one pwritev call takes.
const (
	patternBytes = 64 << 10
	maxIovecs    = 64
)

// direct is what a Tensor knows for writing with pwrite, set once by
// initDirect and only read afterwards.
type direct struct {
	// ok: writes may use pwrite, since the tensor is read-write and its
	// file descriptor is open for reading and writing without O_APPEND
	// (with which Linux's pwrite would append). A Tensor keeps its file
	// open from Create or Open to Close, so the descriptor outlives every
	// write (writes hold t.mu, which Close waits for).
	ok bool
	// sparse: the file has holes (fewer blocks than bytes), so a write can
	// meet a full disk. Writes reserve their rows' blocks first.
	sparse bool
	// inPlace: InPlace was called: every write goes through the mapping,
	// whatever mincore would say (after the reservation of a sparse file).
	inPlace bool
}

// InPlace marks t as a file rewritten in place for its whole life, whose
// pages stay in the page cache: a replay buffer's storage, a ring of
// slots. Its writes then go through the mapping always, never with pwrite
// (see Writes): the first pass over cold pages faults them in as it would
// without pwrite, and every pass after it costs what it did before pwrite
// writes existed. Measured on the replay benchmark (docs/architecture.md,
// "Cold rows are written with pwrite"): with pwrite in the first lap, the
// buffer sampled 18% and inserted 5% slower for as long as it ran. Call it
// before t is used by other goroutines. It does nothing elsewhere than
// Linux, where every write goes through the mapping.
func (t *Tensor) InPlace() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.direct.inPlace = true
}

// initDirect sets t.direct from the open file.
func (t *Tensor) initDirect() {
	if !t.writable || t.size == 0 {
		return
	}
	fd := t.f.Fd()
	fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
	if err != nil || fl&unix.O_ACCMODE != unix.O_RDWR || fl&unix.O_APPEND != 0 {
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil {
		return
	}
	t.direct = direct{ok: true, sparse: st.Blocks*512 < st.Size}
}

// scatter is ScatterAt's write. The caller holds t.mu.
func (t *Tensor) scatter(off int64, rowBytes int, rows []int, src []byte) error {
	if !t.direct.ok || rowBytes == 0 {
		return t.scatterMapped(off, rowBytes, rows, src)
	}
	_, err := t.writeRuns(off, rowBytes, rows, source{b: src})
	return err
}

// fill is FillAt's write. The caller holds t.mu.
func (t *Tensor) fill(off int64, rowBytes int, rows []int, elem []byte) error {
	if !t.direct.ok || rowBytes == 0 {
		return t.fillMapped(off, rowBytes, rows, elem)
	}
	_, err := t.writeRuns(off, rowBytes, rows, source{elem: elem})
	return err
}

// write is WriteAt's write: one run of len(p) bytes. The caller holds t.mu.
func (t *Tensor) write(p []byte, off int64) (int, error) {
	if !t.direct.ok || len(p) == 0 {
		return t.writeMapped(p, off)
	}
	return t.writeRuns(off, len(p), []int{0}, source{b: p})
}

// A source is what a write puts in its rows: bytes (b; row i of the call is
// b[i*rowBytes:(i+1)*rowBytes]), or for a fill (b nil) elem repeated from
// the start of every row.
type source struct {
	b    []byte
	elem []byte
}

// A directWrite is one call's write: its source and what it learnt on the
// way.
type directWrite struct {
	t   *Tensor
	src source
	// checked: the file's size was checked against the data's, mapped: it
	// was shorter (someone truncated it), so everything goes through the
	// mapping and faults as it would without pwrite, instead of pwrite
	// growing the file back.
	checked, mapped bool
	pat             *[]byte // the fill's pattern, once a cold stretch needs it
}

// writeRuns writes the source to the given rows (rows of rowBytes bytes
// from data offset off), run by run in order. For a sparse file it first
// reserves the blocks of every run, so that a full disk is an error before
// any byte is written. It returns how many bytes it wrote before an error,
// counted from the first row: only meaningful for one run (WriteAt).
func (t *Tensor) writeRuns(off int64, rowBytes int, rows []int, src source) (int, error) {
	if t.direct.sparse {
		for i := 0; i < len(rows); {
			j := runEnd(rows, i)
			start := off + int64(rows[i]*rowBytes)
			if err := t.reserveRange(start, int64((j-i)*rowBytes)); err != nil {
				return 0, err
			}
			i = j
		}
	}
	w := directWrite{t: t, src: src}
	defer w.release()
	written := 0
	for i := 0; i < len(rows); {
		j := runEnd(rows, i)
		start := int(off) + rows[i]*rowBytes
		run := w.src
		if run.b != nil {
			run.b = run.b[i*rowBytes : j*rowBytes]
		}
		n, err := w.span(start, (j-i)*rowBytes, run)
		written += n
		if err != nil {
			return written, err
		}
		i = j
	}
	return written, nil
}

// runEnd returns the end of the run of consecutive rows that starts at
// rows[i]: the first j > i with rows[j] != rows[j-1]+1.
func runEnd(rows []int, i int) int {
	j := i + 1
	for j < len(rows) && rows[j] == rows[j-1]+1 {
		j++
	}
	return j
}

// reserveRange allocates the file's blocks under n bytes of data from off
// without changing the file's size or bytes (fallocate with
// FALLOC_FL_KEEP_SIZE). A filesystem without fallocate is left to the
// write itself.
func (t *Tensor) reserveRange(off, n int64) error {
	err := unix.Fallocate(int(t.f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == nil || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return nil
	}
	return fmt.Errorf("write %s: reserving %d bytes at offset %d of a sparse file: %w", t.path, n, off, err)
}

// span writes n bytes of src (the run's own) at data offset start: the
// stretches of pages not in the page cache with pwrite, the others through
// the mapping. It returns how many bytes from start it wrote before an
// error.
func (w *directWrite) span(start, n int, src source) (int, error) {
	t := w.t
	end := start + n
	if n < directMin || t.direct.inPlace {
		return w.copy(start, start, end, src)
	}
	var vec [vecPages]byte
	a := start // the next byte to write
	for chunk := start &^ (pageSize - 1); chunk < end; chunk += vecPages * pageSize {
		cend := min(chunk+vecPages*pageSize, end)
		np := (cend - chunk + pageSize - 1) / pageSize
		if err := mincore(t.data[chunk:cend], vec[:np]); err != nil {
			for k := range vec[:np] {
				vec[k] = 1 // unknown: the mapping, as before
			}
		}
		for i := 0; i < np; {
			cold := vec[i]&1 == 0
			j := i + 1
			for j < np && (vec[j]&1 == 0) == cold {
				j++
			}
			b := min(chunk+j*pageSize, end)
			var k int
			var err error
			if cold && !w.shortFile() {
				k, err = w.pwrite(start, a, b, src)
			} else {
				k, err = w.copy(start, a, b, src)
			}
			if err != nil {
				return a - start + k, err
			}
			a, i = b, j
		}
	}
	return n, nil
}

// shortFile reports whether the file is now shorter than the data, checked
// once per call, before its first pwrite: a file truncated under the
// mapping faults when written through it, and pwrite must not grow it back.
// (A truncation racing with the write itself can still be undone by it, as
// by any write to the file.)
func (w *directWrite) shortFile() bool {
	if !w.checked {
		w.checked = true
		var st unix.Stat_t
		w.mapped = unix.Fstat(int(w.t.f.Fd()), &st) != nil || st.Size < int64(w.t.size)
	}
	return w.mapped
}

// copy writes the bytes [a, b) of the data, in a span that starts at start,
// through the mapping, guarded. It returns b-a, or 0 and an error wrapping
// ErrFault.
func (w *directWrite) copy(start, a, b int, src source) (int, error) {
	t := w.t
	err := guarded(t.path, func() {
		if src.b != nil {
			copy(t.data[a:b], src.b[a-start:b-start])
		} else {
			fillPattern(t.data[a:b], src.elem, (a-start)%len(src.elem))
		}
	})
	if err != nil {
		return 0, err
	}
	return b - a, nil
}

// pwrite writes the bytes [a, b) of the data, in a span that starts at
// start, with pwrite (pwritev of the element pattern for a fill). It
// returns how many bytes it wrote, and an error wrapping the system's.
func (w *directWrite) pwrite(start, a, b int, src source) (int, error) {
	t := w.t
	fd := int(t.f.Fd())
	var n int
	var err error
	if src.b != nil {
		n, err = pwriteAll(fd, src.b[a-start:b-start], int64(a))
	} else {
		n, err = w.pwritePattern(fd, start, a, b, src.elem)
	}
	if err != nil {
		return n, fmt.Errorf("write %s: %d bytes at offset %d: %w", t.path, b-a, a+n, err)
	}
	return n, nil
}

// pwriteAll writes all of p at offset off, as many pwrite calls as it
// takes.
func pwriteAll(fd int, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		k, err := unix.Pwrite(fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			return n, io.ErrShortWrite
		}
		n += k
	}
	return n, nil
}

// pwritePattern writes the bytes [a, b) of a fill's span that starts at
// start: elem repeated, with an element starting at start. Each pwritev
// sends up to maxIovecs copies of one pattern buffer.
func (w *directWrite) pwritePattern(fd, start, a, b int, elem []byte) (int, error) {
	es := len(elem)
	if w.pat == nil {
		w.pat = patterns.Get().(*[]byte)
		fillPattern(*w.pat, elem, 0)
	}
	pat := *w.pat
	l := patternBytes - patternBytes%es // whole elements, so that every copy starts at the same phase
	iovs := make([][]byte, 0, maxIovecs)
	n := 0
	for a+n < b {
		ph := (a + n - start) % es
		iovs = iovs[:0]
		for rest := b - a - n; rest > 0 && len(iovs) < maxIovecs; {
			k := min(rest, l)
			iovs = append(iovs, pat[ph:ph+k])
			rest -= k
		}
		k, err := unix.Pwritev(fd, iovs, int64(a+n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			return n, io.ErrShortWrite
		}
		n += k
	}
	return n, nil
}

// release returns the call's pattern buffer.
func (w *directWrite) release() {
	if w.pat != nil {
		patterns.Put(w.pat)
	}
}

// patterns holds pattern buffers: patternBytes plus room for a phase of up
// to the largest element (16 bytes).
var patterns = sync.Pool{New: func() any {
	b := make([]byte, patternBytes+16)
	return &b
}}

// fillPattern fills dst with elem repeated, starting phase bytes into an
// element: it writes one element's bytes (rotated by phase), doubles them
// up to patternBytes, then copies that block along (it stays in the CPU
// cache).
func fillPattern(dst, elem []byte, phase int) {
	es := len(elem)
	n := copy(dst, elem[phase:])
	n += copy(dst[n:], elem[:phase])
	block := min(len(dst), patternBytes-patternBytes%es)
	for n < block {
		n += copy(dst[n:block], dst[:n])
	}
	for n < len(dst) {
		n += copy(dst[n:], dst[:block])
	}
}
