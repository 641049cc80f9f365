package memmap

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
)

// GatherTo writes to w, in order, the rows GatherAt would copy (rows of
// rowBytes bytes starting at byte offset off), and returns how many bytes
// it wrote. Every index is checked before any byte is written.
//
// When w writes to a file descriptor (it implements syscall.Conn, as
// *net.TCPConn, *net.UnixConn and *os.File do), the rows go to it straight
// from the mapping: the kernel copies them, once, consecutive rows as one
// piece and many pieces in one writev on a socket. A page that faults there
// (the file truncated under the mapping) is the system's EFAULT, returned
// wrapping ErrFault, not a signal. Any other writer (a buffered or
// multiplexed stream, a compressor) gets the rows through a buffer of at
// most 1 MiB, copied under the fault guard, so that no fault can happen
// inside its Write. Either way an error may come after some rows were
// written: w then holds a prefix of them.
//
// GatherTo lasts as long as w takes to accept the bytes, and Close does
// not wait for it: the mapping stays until GatherTo returns, and is let go
// then. Give a connection that may stall a write deadline all the same.
func (t *Tensor) GatherTo(w io.Writer, off int64, rowBytes int, rows []int) (int64, error) {
	if err := t.checkView("gather", off, rowBytes, rows, len(rows)*rowBytes); err != nil {
		return 0, err
	}
	if err := t.pin(); err != nil {
		return 0, err
	}
	defer t.unpin()
	t.prefetch(off, rowBytes, rows)
	if _, ok := w.(syscall.Conn); ok {
		return t.sendDirect(w, off, rowBytes, rows)
	}
	return t.sendCopied(w, off, rowBytes, rows)
}

// maxPieces bounds the pieces sendDirect hands to one net.Buffers: the
// kernel's limit on a writev (IOV_MAX), so that a sample of a million rows
// does not build a million slice headers at once.
const maxPieces = 1024

// sendDirect is GatherTo's path to a file descriptor: w writes straight
// from the mapping. The caller holds a pin.
func (t *Tensor) sendDirect(w io.Writer, off int64, rowBytes int, rows []int) (int64, error) {
	var written int64
	bufs := make(net.Buffers, 0, min(len(rows), maxPieces))
	flush := func() error {
		n, err := bufs.WriteTo(w)
		written += n
		bufs = bufs[:0]
		if errors.Is(err, syscall.EFAULT) {
			return fmt.Errorf("gather %s: %w (was the file truncated?): %w", t.path, ErrFault, err)
		}
		return err
	}
	for i := 0; i < len(rows); {
		// A run of consecutive rows is one piece.
		j := i + 1
		for j < len(rows) && rows[j] == rows[j-1]+1 {
			j++
		}
		start := off + int64(rows[i])*int64(rowBytes)
		bufs = append(bufs, t.data[start:start+int64(j-i)*int64(rowBytes)])
		i = j
		if len(bufs) == maxPieces {
			if err := flush(); err != nil {
				return written, err
			}
		}
	}
	if len(bufs) == 0 {
		return written, nil
	}
	return written, flush()
}

// copyChunk bounds sendCopied's buffer.
const copyChunk = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyChunk); return &b }}

// sendCopied is GatherTo's path to any other writer: rows are copied out of
// the mapping into a pooled buffer, as many as fit in one go under the
// fault guard (a row larger than the buffer in pieces), and the buffer is
// written to w each time it fills. The caller holds a pin.
func (t *Tensor) sendCopied(w io.Writer, off int64, rowBytes int, rows []int) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := (*bp)[:0]
	var written int64
	i, done := 0, 0 // the next row to copy, and how many of its bytes are copied
	fill := func() {
		for i < len(rows) && len(buf) < cap(buf) {
			src := off + int64(rows[i])*int64(rowBytes) + int64(done)
			n := copy(buf[len(buf):cap(buf)], t.data[src:src+int64(rowBytes-done)])
			buf = buf[:len(buf)+n]
			if done += n; done == rowBytes {
				i, done = i+1, 0
			}
		}
	}
	for i < len(rows) {
		if err := guarded(t.path, fill); err != nil {
			return written, err
		}
		n, err := w.Write(buf)
		written += int64(n)
		if err != nil {
			return written, err
		}
		buf = buf[:0]
	}
	return written, nil
}
