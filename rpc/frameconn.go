package rpc

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// frameConn is the connection under a yamux session, and batches yamux's
// writes into fewer system calls.
//
// yamux writes each frame as two writes, its 12-byte header and then the
// body, from one send loop. Unbatched, that is two system calls per frame
// and, on loopback, two wake-ups of the reader: for small calls, most of
// their cost. frameConn joins a data frame's header to its body (only data
// frames, type 0, with a nonzero length are followed by a body: yamux
// spec.md, "Framing"), queues small frames, and lets a flusher goroutine
// write whatever has queued in one write, so frames of concurrent calls
// share a system call, as gRPC's loopy writer does. A large frame is
// written directly by the send loop, after what is queued, without a copy.
type frameConn struct {
	net.Conn
	hdr  [yamuxHeaderSize]byte // a data frame's header, until its body comes
	held bool

	mu      sync.Mutex
	cond    sync.Cond // signalled when a write ends
	queue   []byte    // small frames waiting for the flusher
	spare   []byte
	writing bool      // a write to Conn is in progress
	last    time.Time // when the last write to Conn ended
	err     error
	kick    chan struct{}
	done    chan struct{}
	once    sync.Once

	reads atomic.Uint64 // reads that returned bytes: the watchdog's sign of life

	// What Read passes to yamux is scanned for the frames that close or
	// reset streams, which message streams watch (watch): yamux shows
	// neither until its reader has taken every byte before them, and a
	// stream's reader may have stopped reading (stream.go).
	scanHdr  [yamuxHeaderSize]byte
	scanHave int    // bytes of scanHdr read
	scanSkip uint32 // bytes of a data frame's body still to pass
	watchMu  sync.Mutex
	watches  map[uint32]func(flags uint16)
}

const (
	yamuxHeaderSize       = 12
	yamuxTypeData         = 0
	yamuxTypeWindowUpdate = 1
	yamuxFlagFIN          = 4                     // the sender closed its side of the stream
	yamuxFlagRST          = 8                     // the sender reset the stream
	smallFrame            = 32 << 10              // frames up to this size are queued
	quietWrite            = 50 * time.Microsecond // a small frame after this long without a write is written at once
	maxQueue              = 1 << 20               // the send loop waits while this much is queued
)

func newFrameConn(c net.Conn) *frameConn {
	f := &frameConn{Conn: c, kick: make(chan struct{}, 1), done: make(chan struct{})}
	f.cond.L = &f.mu
	go f.flusher()
	return f
}

// Read is called by yamux's receive loop only; it counts the reads that
// returned bytes, for the client's watchdog.
func (f *frameConn) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	if n > 0 {
		f.reads.Add(1)
		f.scan(p[:n])
	}
	return n, err
}

// scan follows the frames in b, the next bytes yamux reads, and tells the
// watchers of streams that are closed or reset.
func (f *frameConn) scan(b []byte) {
	for len(b) > 0 {
		if f.scanSkip > 0 {
			k := min(uint32(len(b)), f.scanSkip)
			f.scanSkip -= k
			b = b[k:]
			continue
		}
		k := copy(f.scanHdr[f.scanHave:], b)
		f.scanHave += k
		b = b[k:]
		if f.scanHave < yamuxHeaderSize {
			return
		}
		f.scanHave = 0
		h := f.scanHdr[:]
		if h[1] == yamuxTypeData {
			f.scanSkip = binary.BigEndian.Uint32(h[8:])
		}
		if flags := binary.BigEndian.Uint16(h[2:]); flags&(yamuxFlagFIN|yamuxFlagRST) != 0 {
			f.notify(binary.BigEndian.Uint32(h[4:]), flags)
		}
	}
}

// watch calls fn, on yamux's receive loop (it must not block), with the
// flags of every frame that closes or resets stream id, until unwatch.
func (f *frameConn) watch(id uint32, fn func(flags uint16)) {
	f.watchMu.Lock()
	if f.watches == nil {
		f.watches = map[uint32]func(uint16){}
	}
	f.watches[id] = fn
	f.watchMu.Unlock()
}

func (f *frameConn) unwatch(id uint32) {
	f.watchMu.Lock()
	delete(f.watches, id)
	f.watchMu.Unlock()
}

func (f *frameConn) notify(id uint32, flags uint16) {
	f.watchMu.Lock()
	fn := f.watches[id]
	f.watchMu.Unlock()
	if fn != nil {
		fn(flags)
	}
}

// reset sends a yamux RST for stream id: the peer's side of the stream
// fails at once, however much it has buffered (yamux spec.md, "Flag
// Field"). yamux itself sends one only when a closed stream's peer never
// closes its side; this is how a message stream is cancelled. The frame
// goes through the queue, between whole frames.
func (f *frameConn) reset(id uint32) {
	var h [yamuxHeaderSize]byte
	h[1] = yamuxTypeWindowUpdate
	binary.BigEndian.PutUint16(h[2:], yamuxFlagRST)
	binary.BigEndian.PutUint32(h[4:], id)
	f.mu.Lock()
	if f.err == nil {
		f.queue = append(f.queue, h[:]...)
	}
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Write is called by yamux's send loop only.
func (f *frameConn) Write(p []byte) (int, error) {
	var hdr []byte
	if f.held {
		f.held = false
		hdr = f.hdr[:]
	} else if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:]) > 0 {
		copy(f.hdr[:], p)
		f.held = true
		return len(p), nil
	}
	f.mu.Lock()
	if len(hdr)+len(p) <= smallFrame {
		for len(f.queue) >= maxQueue && f.err == nil {
			f.cond.Wait()
		}
		err := f.err
		if err == nil {
			f.queue = append(append(f.queue, hdr...), p...)
		}
		if err == nil && !f.writing && time.Since(f.last) > quietWrite {
			// Nothing written lately, so no frames of other calls are
			// likely to come and share the write: write it here, without
			// waking the flusher (a goroutine hand-off on a lone call's
			// path, a bulk call's header or answer).
			queued := f.queue
			f.queue, f.spare = f.spare[:0], nil
			f.writing = true
			f.mu.Unlock()
			_, err := f.Conn.Write(queued)
			f.finish(queued, err)
			if err != nil {
				return 0, err
			}
			return len(p), nil
		}
		f.mu.Unlock()
		if err != nil {
			return 0, err
		}
		select {
		case f.kick <- struct{}{}:
		default:
		}
		return len(p), nil
	}
	// A large frame: write it here, after the queue, in one writev.
	for f.writing && f.err == nil {
		f.cond.Wait()
	}
	if err := f.err; err != nil {
		f.mu.Unlock()
		return 0, err
	}
	queued := f.queue
	f.queue, f.spare = f.spare[:0], nil
	f.writing = true
	f.mu.Unlock()
	bufs := net.Buffers{queued, hdr, p}
	_, err := bufs.WriteTo(f.Conn)
	f.finish(queued, err)
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// flusher writes the queue whenever the send loop has added to it.
func (f *frameConn) flusher() {
	for {
		select {
		case <-f.kick:
		case <-f.done:
			return
		}
		f.mu.Lock()
		for f.writing && f.err == nil {
			f.cond.Wait()
		}
		if f.err != nil || len(f.queue) == 0 {
			f.mu.Unlock()
			continue
		}
		queued := f.queue
		f.queue, f.spare = f.spare[:0], nil
		f.writing = true
		f.mu.Unlock()
		_, err := f.Conn.Write(queued)
		f.finish(queued, err)
	}
}

// finish ends a write of buf, keeping buf for reuse and recording err.
func (f *frameConn) finish(buf []byte, err error) {
	f.mu.Lock()
	f.writing = false
	f.last = time.Now()
	if f.spare == nil && cap(buf) <= 4*maxQueue {
		f.spare = buf[:0]
	}
	if err != nil && f.err == nil {
		f.err = err
	}
	f.cond.Broadcast()
	f.mu.Unlock()
}

// Close stops the flusher and closes the connection.
func (f *frameConn) Close() error {
	f.once.Do(func() {
		close(f.done)
		f.mu.Lock()
		if f.err == nil {
			f.err = net.ErrClosed
		}
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	return f.Conn.Close()
}

// frameWriter splits writes to a yamux stream into frames of at most
// maxFrame bytes. yamux sends a write as one frame, which its send loop
// copies whole before writing it and the receiver buffers whole before
// its reader sees a byte; with smaller frames the copies on both sides
// overlap the transfer instead of adding to it.
type frameWriter struct{ w io.Writer }

const maxFrame = 512 << 10

func (f frameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k, err := f.w.Write(p[:min(len(p), maxFrame)])
		n += k
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}
