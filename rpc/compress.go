package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/pierrec/lz4/v4"
)

// Compression of bytes-mode bodies (docs/protocol.md, "Compression").
//
// On a protocol version 2 connection a side may send a message's body (the
// bytes of its bytes-mode TensorDicts) as one LZ4 frame, in the LZ4 frame
// format, saying so with the header's raw_len: the body's length
// decompressed. Every version 2 peer decodes such bodies. A sender
// compresses when a sample shows it pays: the body's first 64 KiB (a 64th
// of a body under 4 MiB, 1 KiB at least) are compressed as one lz4 block, and only a body whose sample shrinks below 0.9 of its size is
// compressed whole. Incompressible data (random floats) thus costs one
// block compression, a few microseconds at most, and goes as it is.
//
// The library is github.com/pierrec/lz4/v4: pure Go (no cgo), the LZ4 frame
// format that every lz4 implementation reads, assembly decoding on amd64
// and arm64, and a block API for the sample.

const (
	lz4Sample    = 64 << 10 // bytes of a body compressed to decide, at most
	lz4MinSample = 1 << 10  // at least (or the whole body)
	lz4MinBody   = 1 << 10  // bodies smaller than this go as they are
	lz4Pays      = 0.9      // compress when the sample shrinks below this
	lz4MaxRatio  = 255      // an LZ4 frame of n bytes inflates to at most about 255n
	lz4Slack     = 1 << 10  // plus this much, for small frames' headers
)

// lz4Options are those of the frames this package writes: independent
// blocks of 256 KiB (the reader's buffer is as large as a block) and no
// checksums (TCP, and TLS when configured, check the bytes already).
var lz4Options = []lz4.Option{
	lz4.BlockSizeOption(lz4.Block256Kb),
	lz4.ChecksumOption(false),
	lz4.ConcurrencyOption(1),
}

// outBody is the body of an outgoing message: its parts' bytes, or their
// LZ4 frame.
type outBody struct {
	parts  []bodyPart
	raw    int64   // the parts' bytes
	z      *[]byte // their LZ4 frame, when compressed (pooled; release)
	shared bool    // z is a Seal's, not the pool's
}

// sealBody returns the body of parts, compressed when compress is set and a
// sample of the body pays. An error of the sample or of the compression
// (a mapped tensor whose file shrank, say) sends the parts as they are,
// which reports the error where it always has.
func sealBody(parts []bodyPart, compress bool) outBody {
	b := outBody{parts: parts, raw: bodySize(parts)}
	if compress && b.raw >= lz4MinBody && samplePays(parts, b.raw) {
		b.z = compressParts(parts)
	}
	return b
}

// wireLen returns the bytes the body takes on the wire: the header's body_len.
func (b *outBody) wireLen() int64 {
	if b.z != nil {
		return int64(len(*b.z))
	}
	return b.raw
}

// rawLen returns the header's raw_len: the body's length decompressed, or 0
// when it is not compressed.
func (b *outBody) rawLen() int64 {
	if b.z != nil {
		return b.raw
	}
	return 0
}

// write writes the body to w.
func (b *outBody) write(w io.Writer) error {
	if b.z != nil {
		_, err := w.Write(*b.z)
		return err
	}
	return writeParts(w, b.parts)
}

// release returns the compressed body's buffer to its pool.
func (b *outBody) release() {
	if b.z != nil && b.shared {
		b.z = nil
		return
	}
	if b.z != nil {
		if cap(*b.z) <= maxPooledZ {
			zbufs.Put(b.z)
		}
		b.z = nil
	}
}

// maxPooledZ bounds the compressed buffers kept for reuse.
const maxPooledZ = 16 << 20

var (
	samplers = sync.Pool{New: func() any {
		return &sampler{src: make([]byte, lz4Sample), dst: make([]byte, lz4.CompressBlockBound(lz4Sample))}
	}}
	zwriters = sync.Pool{New: func() any {
		w := lz4.NewWriter(nil)
		if err := w.Apply(lz4Options...); err != nil {
			panic(err) // constant options
		}
		return w
	}}
	zreaders = sync.Pool{New: func() any { return lz4.NewReader(nil) }}
	zbufs    = sync.Pool{New: func() any { return new([]byte) }}
)

type sampler struct {
	c        lz4.Compressor
	src, dst []byte
}

// samplePays reports whether the first lz4Sample bytes of the body of parts
// (raw bytes in all) compress below lz4Pays of their size.
func samplePays(parts []bodyPart, raw int64) bool {
	s := samplers.Get().(*sampler)
	defer samplers.Put(s)
	n := min(raw, lz4Sample, max(raw/64, lz4MinSample))
	var src []byte
	if p := parts[0]; p.rows == nil && !p.t.Mapped() && int64(p.t.NumBytes()) >= n {
		b, err := p.t.Bytes() // sample in place
		if err != nil {
			return false
		}
		src = b[:n]
	} else {
		src = s.src[:n]
		if err := readPrefix(parts, src); err != nil {
			return false
		}
	}
	z, err := s.c.CompressBlock(src, s.dst)
	return err == nil && z > 0 && float64(z) < lz4Pays*float64(len(src))
}

// readPrefix fills dst with the first len(dst) bytes of the body of parts.
func readPrefix(parts []bodyPart, dst []byte) error {
	for _, p := range parts {
		if len(dst) == 0 {
			return nil
		}
		rb := int64(p.t.RowBytes())
		// The part's byte ranges: the whole tensor, or its rows.
		ranges := [][2]int64{{0, int64(p.t.NumBytes())}}
		if p.rows != nil {
			ranges = ranges[:0]
			for _, r := range p.rows {
				ranges = append(ranges, [2]int64{int64(r) * rb, rb})
				if int64(len(ranges))*rb >= int64(len(dst)) {
					break
				}
			}
		}
		for _, rg := range ranges {
			k := min(rg[1], int64(len(dst)))
			if k == 0 {
				continue
			}
			if p.t.Mapped() {
				if _, err := p.t.ReadAt(dst[:k], rg[0]); err != nil {
					return err
				}
			} else {
				b, err := p.t.Bytes()
				if err != nil {
					return err
				}
				copy(dst[:k], b[rg[0]:rg[0]+k])
			}
			dst = dst[k:]
			if len(dst) == 0 {
				return nil
			}
		}
	}
	if len(dst) != 0 {
		return errors.New("rpc: body shorter than its size")
	}
	return nil
}

// compressParts returns the LZ4 frame of the body of parts, or nil if the
// parts could not be read.
func compressParts(parts []bodyPart) *[]byte {
	buf := zbufs.Get().(*[]byte)
	z := compressPartsInto(parts, (*buf)[:0])
	if z == nil {
		zbufs.Put(buf)
		return nil
	}
	*buf = z
	return buf
}

// compressPartsInto appends the LZ4 frame of the body of parts to dst and
// returns it, or nil if the parts could not be read.
func compressPartsInto(parts []bodyPart, dst []byte) []byte {
	w := zwriters.Get().(*lz4.Writer)
	defer zwriters.Put(w)
	sw := sliceWriter(dst)
	w.Reset(&sw)
	err := writeParts(w, parts)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	w.Reset(nil)
	if err != nil {
		return nil
	}
	return sw
}

// sliceWriter appends to a byte slice.
type sliceWriter []byte

func (s *sliceWriter) Write(p []byte) (int, error) {
	*s = append(*s, p...)
	return len(p), nil
}

// checkRaw checks a header's raw_len against its body_len and the limits
// before anything is allocated for the body: a compressed body's claimed
// length must be within MaxBodyBytes and within what an LZ4 frame of
// body_len bytes can inflate to, so a few bytes cannot make the receiver
// allocate gigabytes. v2 says whether the connection speaks version 2; a
// version 1 peer sends no compressed bodies.
func checkRaw(bodyLen, rawLen int64, l *Limits, v2 bool) error {
	switch {
	case rawLen == 0:
		return nil
	case !v2:
		return fmt.Errorf("%w: a compressed body on a protocol version 1 connection", errProtocol)
	case rawLen < 0 || rawLen > l.MaxBodyBytes:
		return fmt.Errorf("%w: compressed body of %d bytes decompressed (limit %d)", errProtocol, rawLen, l.MaxBodyBytes)
	case bodyLen <= 0 || rawLen > bodyLen*lz4MaxRatio+lz4Slack:
		return fmt.Errorf("%w: %d bytes of LZ4 claim to inflate to %d", errProtocol, bodyLen, rawLen)
	}
	return nil
}

// newBodyReader returns a reader of a message's body that follows in r:
// bodyLen bytes, an LZ4 frame of rawLen bytes when rawLen > 0 (checkRaw
// has passed).
func newBodyReader(r io.Reader, bodyLen, rawLen int64) *bodyReader {
	if rawLen <= 0 {
		return &bodyReader{r: r, n: bodyLen}
	}
	z := &inflater{wire: wireReader{r: r, n: bodyLen}, zr: zreaders.Get().(*lz4.Reader), corrupt: InvalidArgument}
	z.zr.Reset(&z.wire)
	return &bodyReader{r: z.zr, n: rawLen, z: z}
}

// inflater is a compressed body being read.
type inflater struct {
	wire    wireReader
	zr      *lz4.Reader
	corrupt Code // the code of corrupt data: InvalidArgument, or Internal in a response
}

// wireReader reads at most n bytes of r, and keeps r's error: a failure of
// the stream, as opposed to of the LZ4 data in it.
type wireReader struct {
	r   io.Reader
	n   int64
	err error
}

func (w *wireReader) Read(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, io.EOF // the body ends: the LZ4 frame must end too
	}
	if int64(len(p)) > w.n {
		p = p[:w.n]
	}
	k, err := w.r.Read(p)
	w.n -= int64(k)
	if err != nil && (err != io.EOF || w.n > 0) {
		if w.err == nil {
			w.err = unexpected(err)
		}
		return k, w.err
	}
	return k, nil
}

// fillErr turns an error of reading a compressed body into the call's: a
// failure of the stream, or corrupt LZ4 data (z.corrupt: the stream is
// still in step once the rest of the body is drained).
func (z *inflater) fillErr(err error) error {
	if z.wire.err != nil {
		return &streamError{z.wire.err}
	}
	return Errorf(z.corrupt, "corrupt lz4 body: %v", err)
}

// end checks, once the body's raw_len bytes are read, that its LZ4 frame
// ends there, and the body with it.
func (z *inflater) end() error {
	var one [1]byte
	k, err := z.zr.Read(one[:])
	switch {
	case k > 0:
		return Errorf(z.corrupt, "lz4 body inflates past its raw_len")
	case err != io.EOF:
		return z.fillErr(err)
	case z.wire.n != 0:
		return Errorf(z.corrupt, "%d bytes after the lz4 frame in the body", z.wire.n)
	}
	return nil
}

// corruptCode sets the code of a compressed body's corrupt data.
func (b *bodyReader) corruptCode(c Code) *bodyReader {
	if b.z != nil {
		b.z.corrupt = c
	}
	return b
}

// drain discards what is left of the compressed body on the stream and
// returns the decompressor to its pool.
func (z *inflater) drain() error {
	z.zr.Reset(nil)
	zreaders.Put(z.zr)
	z.zr = nil
	if z.wire.err != nil {
		return &streamError{z.wire.err}
	}
	if z.wire.n > 0 {
		if _, err := io.CopyN(io.Discard, z.wire.r, z.wire.n); err != nil {
			return &streamError{unexpected(err)}
		}
		z.wire.n = 0
	}
	return nil
}

// uncompressedKey is the context key of Uncompressed.
type uncompressedKey struct{}

// Uncompressed returns a context under which calls and streams send their
// bodies as they are, and ask the node to answer the same way: for data a
// caller knows will not compress, or to measure without compression. It is
// WithCompression(false) for one call or stream.
func Uncompressed(ctx context.Context) context.Context {
	return context.WithValue(ctx, uncompressedKey{}, true)
}

func isUncompressed(ctx context.Context) bool {
	v, _ := ctx.Value(uncompressedKey{}).(bool)
	return v
}
