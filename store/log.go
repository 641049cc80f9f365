package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// The log (docs/store.md, "The log") is the store's one source of truth:
// every change is a record appended to it, and Open rebuilds the state by
// reading it from the start. A file is
//
//	"TWSLOG01"
//	records, each:
//	  "TWR1"
//	  uint32 little-endian  payload length N
//	  uint32 little-endian  CRC-32C of the payload and the revision
//	  N bytes               the payload: a msgpack record
//	  uint64 little-endian  the revision (0: not an event)
//
// The revision trails the payload so that a record's payload, which may
// hold a value's bytes, is encoded and checksummed before the store takes
// its lock to number it.
// A log that grows past Options.CompactBytes is rewritten as the state it
// describes (compact), into a new file renamed over the old one.

const (
	logMagic     = "TWSLOG01"
	recordMagic  = "TWR1"
	frameHeader  = 12
	frameTrailer = 8
	// maxRecord bounds a record's payload: a value inline is at most
	// Options.InlineBytes, which Options caps well below this.
	maxRecord = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is one entry of the log. Rev is the store's revision after it
// (an event), or 0 in the records of a compacted log that restate the
// state (they are no events).
type record struct {
	Rev     uint64    `codec:"-"` // in the frame's trailer
	Op      uint8     `codec:"op"`
	Name    string    `codec:"name"`
	Items   []recItem `codec:"items"`
	IDs     []uint64  `codec:"ids"`
	Take    uint64    `codec:"take"`
	Version uint64    `codec:"version"`
	Req     reqID     `codec:"req"` // the client's request, so a retry is recognised

	// recBase only.
	NextID uint64     `codec:"next_id"`
	Takes  []uint64   `codec:"takes"` // Gets acknowledged recently
	Reqs   []reqEntry `codec:"reqs"`  // requests made recently
}

// recItem is a value in a record: inline bytes, or the prefix
// values/<ID> when Inline is nil.
type recItem struct {
	ID     uint64 `codec:"id"`
	Size   int64  `codec:"size"`
	Inline []byte `codec:"inline"`
}

// reqID names one mutating request of one client: a retried request
// carries the same one.
type reqID struct {
	Client uint64 `codec:"client"`
	Seq    uint64 `codec:"seq"`
}

// reqEntry is a request made and what it returned.
type reqEntry struct {
	ID      reqID  `codec:"id"`
	Rev     uint64 `codec:"rev"`
	Version uint64 `codec:"version"`
}

// prepared is a record encoded as a frame, waiting for its revision.
type prepared struct {
	frame []byte
	crc   uint32 // of the payload
}

// prepare encodes rec (all but its revision) as a frame. The payload is
// encoded in place, in a buffer sized from the values the record carries:
// a record holding a 28 KB item costs one allocation and one copy of it.
func prepare(rec *record) (prepared, error) {
	est := 256 + len(rec.Name) + 10*(len(rec.IDs)+len(rec.Takes)) + 32*len(rec.Reqs)
	for _, it := range rec.Items {
		est += 64 + len(it.Inline)
	}
	out := make([]byte, frameHeader+est+frameTrailer)
	p, err := encodeMsgpackInto(out[frameHeader:frameHeader], rec)
	if err != nil {
		return prepared{}, fmt.Errorf("store: encoding a log record: %w", err)
	}
	if len(p) > maxRecord {
		return prepared{}, errorf(ErrTooLarge, "a log record of %d bytes, over %d: the values of one Extend are too many or too large", len(p), maxRecord)
	}
	if len(p) > 0 && len(p) <= est && &p[0] == &out[frameHeader] {
		out = out[:frameHeader+len(p)+frameTrailer] // encoded in place
	} else {
		out = make([]byte, frameHeader+len(p)+frameTrailer)
		copy(out[frameHeader:], p)
	}
	clear(out[frameHeader+len(p):]) // the trailer: seal writes it
	copy(out, recordMagic)
	binary.LittleEndian.PutUint32(out[4:], uint32(len(p)))
	return prepared{frame: out, crc: crc32.Checksum(out[frameHeader:frameHeader+len(p)], castagnoli)}, nil
}

// seal numbers a prepared frame with rev and returns it.
func (p prepared) seal(rev uint64) []byte {
	t := p.frame[len(p.frame)-frameTrailer:]
	binary.LittleEndian.PutUint64(t, rev)
	binary.LittleEndian.PutUint32(p.frame[8:], crc32.Update(p.crc, castagnoli, t))
	return p.frame
}

// readLog calls apply with each record of the log file f, in order, and
// returns the offset where the good records end. A damaged or incomplete
// record with no good record after it is a torn tail (a write the crash
// cut short, never acknowledged): the offset is where it starts, and the
// caller truncates there. A damaged record followed by a good one is
// ErrCorrupt: acknowledged operations would be lost by dropping it. A
// record whose header is whole is followed by what lies past its claimed
// end: one that runs past the file's end is a torn tail whatever its
// payload holds (as etcd's WAL repairs a last record cut short).
func readLog(f *os.File, apply func(*record) error) (int64, error) {
	r := bufio.NewReaderSize(f, 1<<20)
	head := make([]byte, len(logMagic))
	if _, err := io.ReadFull(r, head); err != nil || string(head) != logMagic {
		return 0, fmt.Errorf("%w: %s does not start as a store log", ErrCorrupt, f.Name())
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	fileSize := fi.Size()
	off := int64(len(logMagic))
	var hdr [frameHeader]byte
	var payload []byte
	for {
		n, err := io.ReadFull(r, hdr[:])
		if err == io.EOF {
			return off, nil
		}
		bad := ""
		switch {
		case err != nil:
			bad = fmt.Sprintf("a frame header cut after %d bytes", n)
		case string(hdr[:4]) != recordMagic:
			bad = "no record marker"
		}
		var size int
		// next is where good records after a damaged one are looked for:
		// past the record's claimed end when its header is whole, so that
		// a torn record's own payload (which may hold a frame of the
		// caller's bytes) is never taken for records after it.
		next := off + 1
		if bad == "" {
			size = int(binary.LittleEndian.Uint32(hdr[4:]))
			if size > maxRecord {
				bad = fmt.Sprintf("a record of %d bytes", size)
			} else if next = off + frameHeader + int64(size) + frameTrailer; next > fileSize {
				// Never allocate for bytes the file does not have.
				bad = fmt.Sprintf("a record of %d bytes with %d left in the file", size, fileSize-off-frameHeader)
			}
		}
		if bad == "" {
			if cap(payload) < size+frameTrailer {
				payload = make([]byte, size+frameTrailer)
			}
			payload = payload[:size+frameTrailer]
			if n, err := io.ReadFull(r, payload); err != nil {
				bad = fmt.Sprintf("a record cut after %d of %d bytes", n, size+frameTrailer)
			} else if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[8:]) {
				bad = "a checksum mismatch"
			}
		}
		if bad != "" {
			if goodAfter(f, next) {
				return off, fmt.Errorf("%w: %s at offset %d: %s, and good records after it", ErrCorrupt, f.Name(), off, bad)
			}
			return off, nil
		}
		var rec record
		if err := decodeMsgpack(payload[:size], &rec); err != nil {
			return off, fmt.Errorf("%w: %s at offset %d: a record that does not decode: %v", ErrCorrupt, f.Name(), off, err)
		}
		rec.Rev = binary.LittleEndian.Uint64(payload[size:])
		if err := apply(&rec); err != nil {
			return off, fmt.Errorf("%s at offset %d: %w", f.Name(), off, err)
		}
		off += frameHeader + int64(size) + frameTrailer
	}
}

// goodAfter reports whether f holds a whole record with a good checksum
// starting anywhere at or after off.
func goodAfter(f *os.File, off int64) bool {
	fi, err := f.Stat()
	if err != nil {
		return true // cannot tell: do not call the damage a torn tail
	}
	data := make([]byte, max(fi.Size()-off, 0))
	if _, err := f.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
		return true
	}
	for i := 0; ; {
		j := bytes.Index(data[i:], []byte(recordMagic))
		if j < 0 {
			return false
		}
		p := data[i+j:]
		if len(p) >= frameHeader {
			size := int(binary.LittleEndian.Uint32(p[4:])) + frameTrailer
			if size <= len(p)-frameHeader &&
				crc32.Checksum(p[frameHeader:frameHeader+size], castagnoli) == binary.LittleEndian.Uint32(p[8:]) {
				return true
			}
		}
		i += j + 1
	}
}

// logWriter appends frames to the log file with group commit: callers
// queue frames (in revision order, under the store's lock) and wait until
// the frame of their revision is durable. Two goroutines of the store run
// it as a pipeline: the writer writes every queued frame with one write,
// and the syncer makes what was written durable with one fdatasync, while
// the writer already writes the next batch. Each sync covers every frame
// written before it started.
type logWriter struct {
	noSync bool
	// check, if set, is called with the file after each sync (each write,
	// with noSync) before what it covered counts as durable: an error
	// stops the log (the store's files were removed, ErrLost).
	check func(*os.File) error
	// stopped, if set, is told once why the log stopped.
	stopped func(error)
	// advanced, if set, is called (outside mu) with each new durable
	// revision before those waiting for it are woken, so that a caller
	// whose operation returned finds the store's own record of what is
	// durable at least as new; and with 0 when the syncer stops.
	advanced func(uint64)

	mu sync.Mutex
	// cond wakes those waiting for durability (wait, waitSynced): it is
	// broadcast when durable advances or the log stops, and only then, so
	// that a waiter is not woken by every record queued behind it. work
	// wakes the writer and the syncer: records queued, written, the end.
	cond    *sync.Cond
	work    *sync.Cond
	f       *os.File
	size    int64
	queue   []queued
	written uint64 // every record up to this revision is written
	durable uint64 // every record up to this revision is durable
	err     error  // sticky: set when a write or sync fails
	closed  bool
	done    bool // the writer has stopped: nothing more will be written
}

type queued struct {
	frame []byte
	rev   uint64
}

func newLogWriter(f *os.File, size int64, rev uint64, noSync bool) *logWriter {
	w := &logWriter{f: f, size: size, written: rev, durable: rev, noSync: noSync}
	w.cond = sync.NewCond(&w.mu)
	w.work = sync.NewCond(&w.mu)
	return w
}

// enqueue adds a frame with revision rev, larger than any queued before.
func (w *logWriter) enqueue(frame []byte, rev uint64) {
	w.mu.Lock()
	w.queue = append(w.queue, queued{frame, rev})
	w.mu.Unlock()
	w.work.Broadcast() // the writer (the syncer, waiting on the same, goes back to sleep)
}

// wait blocks until revision rev is durable, and returns nil, or returns
// the error that stopped the log.
func (w *logWriter) wait(rev uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.durable < rev && w.err == nil {
		w.cond.Wait()
	}
	if w.durable >= rev {
		return nil
	}
	return w.err
}

// next blocks until frames are queued or the writer is closed, and takes
// them. ok is false once closed with nothing left to write, or failed.
func (w *logWriter) next() (batch []queued, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.queue) == 0 && !w.closed && w.err == nil {
		w.work.Wait()
	}
	if w.err != nil || len(w.queue) == 0 {
		return nil, false
	}
	batch, w.queue = w.queue, nil
	return batch, true
}

// write writes a batch with one writev(2) (one write, through buf, where
// there is no writev). Without sync it is durable as
// far as the log promises (Options.NoSync) at once; otherwise the syncer
// makes it so. frames and buf are the caller's scratch, reused from batch
// to batch (the writer goroutine's own).
func (w *logWriter) write(batch []queued, frames *[][]byte, buf *[]byte) error {
	fs := (*frames)[:0]
	size := 0
	for _, q := range batch {
		fs = append(fs, q.frame)
		size += len(q.frame)
	}
	_, err := writeFrames(w.f, fs, buf)
	clear(fs) // no frame kept alive by the scratch
	*frames = fs
	if err != nil {
		err = fmt.Errorf("%w: %v", ErrFailed, err)
	} else if w.noSync && w.check != nil {
		err = w.check(w.f)
	}
	rev := batch[len(batch)-1].rev
	w.mu.Lock()
	if err != nil {
		w.failLocked(err)
	} else {
		w.size += int64(size)
		w.written = rev
	}
	w.mu.Unlock()
	w.work.Broadcast() // the syncer
	switch {
	case err != nil:
		w.cond.Broadcast()
	case w.noSync:
		w.madeDurable(rev)
	}
	return err
}

// testHookDurable, if set, is called in madeDurable between telling the
// store and recording the revision for those waiting (tests of that
// order). An atomic, so that tests set it while a store runs.
var testHookDurable atomic.Pointer[func(rev uint64)]

// madeDurable records that every record up to rev is durable. It tells
// advanced first, and only then moves w.durable and wakes those waiting:
// whoever sees w.durable >= rev, woken by this call or by any other, finds
// the store told.
func (w *logWriter) madeDurable(rev uint64) {
	if w.advanced != nil {
		w.advanced(rev)
	}
	if h := testHookDurable.Load(); h != nil {
		(*h)(rev)
	}
	w.mu.Lock()
	w.durable = max(w.durable, rev)
	w.mu.Unlock()
	w.cond.Broadcast()
}

// failLocked stops the log with err unless it stopped already; w.mu is
// held.
func (w *logWriter) failLocked(err error) {
	if w.err != nil {
		return
	}
	w.err = err
	if w.stopped != nil {
		w.stopped(err)
	}
}

// fail stops the log with err unless it stopped already, and wakes those
// waiting.
func (w *logWriter) fail(err error) {
	w.mu.Lock()
	w.failLocked(err)
	w.mu.Unlock()
	w.wake()
}

// wake wakes everyone waiting on the writer: the writer, the syncer and
// those waiting for durability, for changes all of them must see (the
// log stopped, closed, compacted).
func (w *logWriter) wake() {
	w.work.Broadcast()
	w.cond.Broadcast()
}

// syncLoop makes written records durable (madeDurable with each new
// durable revision), until the writer is closed and everything written is
// durable, or a sync fails; then it calls advanced with 0.
func (w *logWriter) syncLoop() {
	stop := func() {
		if w.advanced != nil {
			w.advanced(0)
		}
	}
	for {
		w.mu.Lock()
		// With noSync the writer makes its records durable itself.
		for (w.noSync || w.written == w.durable) && !w.done && w.err == nil {
			w.work.Wait()
		}
		if w.err != nil || w.noSync || w.written == w.durable {
			w.mu.Unlock()
			stop()
			return
		}
		target, f := w.written, w.f
		w.mu.Unlock()
		err := syncData(f)
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrFailed, err)
		} else if w.check != nil {
			err = w.check(f) // the synced file must still be the log
		}
		if err != nil {
			w.fail(err)
			stop()
			return
		}
		w.madeDurable(target)
	}
}

// waitSynced blocks until everything written is durable (the syncer is
// idle), or the log failed.
func (w *logWriter) waitSynced() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.durable < w.written && w.err == nil {
		w.cond.Wait()
	}
	return w.err
}

// failed returns the error that stopped the log, or nil.
func (w *logWriter) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// writerDone records that the writer has stopped; the syncer stops once
// everything it wrote is durable.
func (w *logWriter) writerDone() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
	w.wake()
}

// close stops the writer once the queue is empty, and so the syncer once
// everything written is durable.
func (w *logWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wake()
}
