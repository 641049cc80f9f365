package rpc

import (
	"io"
	"math/bits"
	"sync"

	"github.com/tensorwire/tensorwire/tensordict"
)

// bodySize returns the bytes parts take on the wire.
func bodySize(parts []bodyPart) int64 {
	var n int64
	for _, p := range parts {
		n += p.size()
	}
	return n
}

// writeParts writes the parts' bytes to w in order, each as its tensor's
// GatherTo writes it: a mapped tensor straight from the mapping when w is a
// connection's own descriptor (a side connection), else through a bounded
// buffer whose copy is guarded against faults (a yamux stream, the LZ4
// compressor).
func writeParts(w io.Writer, parts []bodyPart) error {
	for _, p := range parts {
		if _, err := p.t.GatherTo(w, p.rows); err != nil {
			return err
		}
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
	if err := b.has(t, int64(len(dst))); err != nil {
		return err
	}
	return b.read(dst)
}

// has checks that the body holds the n bytes of tensor t.
func (b *bodyReader) has(t *tensordict.Tensor, n int64) error {
	if n > b.n {
		return Errorf(InvalidArgument, "body too short: a %v tensor needs %d bytes, %d left", t.Shape(), n, b.n)
	}
	return nil
}

// read reads the next len(p) bytes of the body into p, which the caller
// has checked it holds.
func (b *bodyReader) read(p []byte) error {
	if _, err := io.ReadFull(b.r, p); err != nil {
		if b.z != nil {
			return b.z.fillErr(err)
		}
		return &streamError{unexpected(err)}
	}
	b.n -= int64(len(p))
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
