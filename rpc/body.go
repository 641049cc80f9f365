package rpc

import (
	"fmt"
	"io"
	"math/bits"
	"sync"

	"github.com/tensorwire/tensorwire/tensordict"
)

// chunk bounds the buffer through which mapped tensor bytes are copied to a
// stream: the copy goes through the mapping's fault guard, and memory stays
// bounded however large the tensor.
const chunk = 1 << 20

var chunks = sync.Pool{New: func() any { b := make([]byte, chunk); return &b }}

// bodySize returns the bytes parts take on the wire.
func bodySize(parts []bodyPart) int64 {
	var n int64
	for _, p := range parts {
		n += p.size()
	}
	return n
}

// writeParts writes the parts' bytes to w in order: a Go-memory tensor
// straight from its memory, a mapped one through a pooled buffer.
func writeParts(w io.Writer, parts []bodyPart) error {
	for _, p := range parts {
		rb := p.t.RowBytes()
		if !p.t.Mapped() {
			b, err := p.t.Bytes()
			if err != nil {
				return err
			}
			if p.rows == nil {
				if _, err := w.Write(b); err != nil {
					return err
				}
				continue
			}
			for _, r := range p.rows {
				if _, err := w.Write(b[r*rb : (r+1)*rb]); err != nil {
					return err
				}
			}
			continue
		}
		if p.rows == nil {
			if err := copyMapped(w, p.t, 0, int64(p.t.NumBytes())); err != nil {
				return err
			}
			continue
		}
		for _, r := range p.rows {
			if err := copyMapped(w, p.t, int64(r)*int64(rb), int64(rb)); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyMapped writes n bytes of t from byte offset off to w.
func copyMapped(w io.Writer, t *tensordict.Tensor, off, n int64) error {
	bp := chunks.Get().(*[]byte)
	defer chunks.Put(bp)
	buf := *bp
	for n > 0 {
		b := buf[:min(int64(len(buf)), n)]
		if _, err := t.ReadAt(b, off); err != nil {
			return fmt.Errorf("rpc: read %s: %w", t.Path(), err)
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		off += int64(len(b))
		n -= int64(len(b))
	}
	return nil
}

// bodyReader reads a message's body into tensors, refusing to read past it
// (newBodyReader).
type bodyReader struct {
	r io.Reader
	n int64     // bytes left (decompressed)
	z *inflater // set when the body is compressed: r reads from z
}

// fill reads t's bytes (a Go-memory tensor) from the body.
func (b *bodyReader) fill(t *tensordict.Tensor) error {
	dst, err := t.Bytes()
	if err != nil {
		return err
	}
	if int64(len(dst)) > b.n {
		return Errorf(InvalidArgument, "body too short: a %v tensor needs %d bytes, %d left", t.Shape(), len(dst), b.n)
	}
	if _, err := io.ReadFull(b.r, dst); err != nil {
		if b.z != nil {
			return b.z.fillErr(err)
		}
		return &streamError{unexpected(err)}
	}
	b.n -= int64(len(dst))
	if b.n == 0 && b.z != nil {
		return b.z.end()
	}
	return nil
}

// drain discards what is left of the body, so the stream can carry the
// next message.
func (b *bodyReader) drain() error {
	if b.z != nil {
		z := b.z
		b.z, b.n = nil, 0
		return z.drain()
	}
	if b.n == 0 {
		return nil
	}
	_, err := io.CopyN(io.Discard, b.r, b.n)
	b.n = 0
	if err != nil {
		return &streamError{unexpected(err)}
	}
	return nil
}

// streamError is a failure of the stream itself (not of the call): the
// stream can carry nothing more and is closed.
type streamError struct{ err error }

func (e *streamError) Error() string { return e.err.Error() }
func (e *streamError) Unwrap() error { return e.err }

// Buffers for tensors that arrive as bytes in handlers' arguments, pooled
// by power-of-two size class: a 6 MB argument would otherwise cost a fresh
// allocation, zeroed, and the garbage collector's time, on every call.
var bufPools [41]sync.Pool

// minPooled is the smallest buffer worth pooling. 16 KiB, not 64: a
// store's 28 KB appends, each a fresh buffer, made the node collect
// garbage every few dozen items (2026-12-01, bench store: 3% to 11% more
// items/s, 110 KB allocated an item in process down to 81).
const minPooled = 16 << 10

// getBuf returns a buffer of at least n bytes (contents undefined).
func getBuf(n int) *[]byte {
	if n < minPooled || n > 1<<40 {
		b := make([]byte, n)
		return &b
	}
	class := bits.Len(uint(n - 1))
	if bp, ok := bufPools[class].Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, 1<<class)
	return &b
}

// putBuf returns a buffer from getBuf to its pool.
func putBuf(bp *[]byte) {
	c := cap(*bp)
	if c < minPooled || c&(c-1) != 0 {
		return
	}
	bufPools[bits.Len(uint(c-1))].Put(bp)
}
