package rpc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sync"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// A message on a stream (docs/protocol.md, "Messages") is
//
//	uint32 big-endian  header length H, 1 <= H <= Limits.MaxHeaderBytes
//	H bytes            the header, a msgpack map (requestHeader or responseHeader)
//	ArgLen bytes       the call's argument or result, msgpack
//	BodyLen bytes      bulk tensor bytes, raw
//
// Bulk bytes never go inside msgpack: they are written straight from the
// tensors to the stream and read straight into them.

// requestHeader opens a call, or a message stream. Field names are the
// wire's; see protocol.md. The keys with omitempty are versions 2's and 3's, and
// left out when zero.
type requestHeader struct {
	Method    string `codec:"method"`
	TimeoutUS int64  `codec:"timeout_us"` // the caller's remaining time; 0: none
	ArgLen    int64  `codec:"arg_len"`
	BodyLen   int64  `codec:"body_len"`               // bytes on the wire
	RawLen    int64  `codec:"raw_len,omitempty"`      // > 0: the body is an LZ4 frame of this many bytes
	Stream    bool   `codec:"stream,omitempty"`       // opens a message stream (stream.go)
	NoLZ4     bool   `codec:"uncompressed,omitempty"` // the caller wants its answer's bodies uncompressed
	Side      int64  `codec:"side,omitempty"`         // version 3: the side connection the caller holds for the call or stream (side.go)
	SideBody  bool   `codec:"side_body,omitempty"`    // version 3: the body follows on that side connection
}

// responseHeader answers a call. Code 0 is success; otherwise Message says
// what went wrong, Reason names it when it has a name (left out of the
// encoding when empty), and ArgLen and BodyLen are 0.
type responseHeader struct {
	Code    uint8  `codec:"code"`
	Message string `codec:"message"`
	Reason  string `codec:"reason,omitempty"`
	ArgLen  int64  `codec:"arg_len"`
	BodyLen int64  `codec:"body_len"`
	RawLen  int64  `codec:"raw_len,omitempty"` // as in requestHeader
}

// errProtocol marks bytes that break the message format or the limits: the
// connection they came on is closed.
var errProtocol = errors.New("rpc: protocol violation")

// handle is the one msgpack configuration of the package (go-msgpack's
// handles are safe for concurrent use once set up). Schema-less maps decode
// as map[string]any; raw strings stay []byte unless typed.
var handle = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true}
	h.MapType = reflect.TypeOf(map[string]any(nil))
	h.RawToString = false
	h.MaxDepth = 64
	return h
}()

// Encoders and decoders are costly to build (a third of a small call's
// encoding time): they are pooled and reset for each value.
var (
	encoders = sync.Pool{New: func() any { return codec.NewEncoderBytes(new([]byte), handle) }}
	decoders = sync.Pool{New: func() any { return codec.NewDecoderBytes(nil, handle) }}
)

// encodeMsgpack returns v's msgpack encoding.
func encodeMsgpack(v any) ([]byte, error) {
	var buf []byte
	if err := encodeInto(&buf, v); err != nil {
		return nil, err
	}
	return buf, nil
}

// encodeInto encodes v into *buf, reusing its capacity (go-msgpack
// allocates 1 KiB for a nil one).
func encodeInto(buf *[]byte, v any) error {
	enc := encoders.Get().(*codec.Encoder)
	defer encoders.Put(enc)
	*buf = (*buf)[:0]
	enc.ResetBytes(buf)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("rpc: encode %T: %w", v, err)
	}
	return nil
}

// argBufs are buffers for the arguments and results of calls, which are
// written to the stream (copied) before their call returns.
var argBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

// encodeArgs encodes v into a pooled buffer; putArgs gives it back once
// its bytes are written.
func encodeArgs(v any) (*[]byte, error) {
	bp := argBufs.Get().(*[]byte)
	if err := encodeInto(bp, v); err != nil {
		putArgs(bp)
		return nil, err
	}
	return bp, nil
}

// putArgs returns a buffer of encodeArgs to the pool, unless it grew large.
func putArgs(bp *[]byte) {
	if bp != nil && cap(*bp) <= 64<<10 {
		argBufs.Put(bp)
	}
}

// decodeMsgpack decodes b, which must hold exactly one value, into v.
func decodeMsgpack(b []byte, v any) error {
	dec := decoders.Get().(*codec.Decoder)
	defer func() {
		dec.ResetBytes(nil) // drop b
		decoders.Put(dec)
	}()
	dec.ResetBytes(b)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: decode %T: %v", errProtocol, v, err)
	}
	if dec.NumBytesRead() != len(b) {
		return fmt.Errorf("%w: %d bytes after the %T", errProtocol, len(b)-dec.NumBytesRead(), v)
	}
	return nil
}

// writeFrame writes a message's length-prefixed header and its argument
// bytes to w (the body follows separately). The header is encoded in w's
// own buffer.
func writeFrame(w *bufio.Writer, hdr header, args []byte) error {
	buf := hdr.appendMsgpack(append(w.AvailableBuffer(), 0, 0, 0, 0))
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	if _, err := w.Write(buf); err != nil {
		return err
	}
	_, err := w.Write(args)
	return err
}

// readHeader reads a length-prefixed header into hdr. io.EOF means the
// stream ended cleanly between messages. A length of 0 or above max is an
// errProtocol before any of the header is read, so a peer claiming 4 GB
// costs nothing. A header that fits r's buffer is decoded there.
func readHeader(r *bufio.Reader, max int, hdr header) error {
	n, err := r.Peek(4)
	if err != nil {
		if len(n) > 0 {
			return unexpected(err)
		}
		return err
	}
	size32 := binary.BigEndian.Uint32(n)
	if size32 == 0 || uint64(size32) > uint64(max) {
		return fmt.Errorf("%w: header of %d bytes (limit %d)", errProtocol, size32, max)
	}
	size := int(size32)
	r.Discard(4)
	if size > r.Size() {
		b := make([]byte, size)
		if _, err := io.ReadFull(r, b); err != nil {
			return unexpected(err)
		}
		return hdr.decodeMsgpack(b)
	}
	b, err := r.Peek(size)
	if err != nil {
		return unexpected(err)
	}
	err = hdr.decodeMsgpack(b)
	r.Discard(size)
	return err
}

// readArgs reads n argument bytes, n already checked against the limit.
func readArgs(r *bufio.Reader, n int64) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, unexpected(err)
	}
	return b, nil
}

// unexpected turns io.EOF inside a message into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// checkSide checks a request header's side connection keys: only in
// protocol version 3, an id that fits 32 bits, and a body on a side
// connection only when the header names one.
func checkSide(side int64, sideBody bool, version uint8) error {
	switch {
	case side == 0 && !sideBody:
		return nil
	case version < sideVersion:
		return fmt.Errorf("%w: side connection keys in protocol version %d", errProtocol, version)
	case side < 0 || side > math.MaxUint32:
		return fmt.Errorf("%w: side connection %d", errProtocol, side)
	case sideBody && side == 0:
		return fmt.Errorf("%w: a body on a side connection the request does not name", errProtocol)
	}
	return nil
}

// checkLens checks a header's sizes against the limits.
func checkLens(argLen, bodyLen int64, l *Limits) error {
	if argLen < 0 || argLen > int64(l.MaxArgBytes) {
		return fmt.Errorf("%w: argument of %d bytes (limit %d)", errProtocol, argLen, l.MaxArgBytes)
	}
	if bodyLen < 0 || bodyLen > l.MaxBodyBytes {
		return fmt.Errorf("%w: body of %d bytes (limit %d)", errProtocol, bodyLen, l.MaxBodyBytes)
	}
	return nil
}
