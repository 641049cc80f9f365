package rpc

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Message headers are msgpack maps of string keys to integers, strings and
// booleans (docs/protocol.md, "Messages" and "Streams"). They are on every call's path, so they
// are encoded and decoded here by hand rather than by reflection: the
// bytes are those go-msgpack writes for the same structs (keys in sorted
// order, integers in their smallest signed form, a response's empty
// "reason" left out as omitempty does; golden_test.go pins them),
// and the decoder accepts any valid encoding of such a map (keys in any
// order, any integer width), skipping keys it does not know so fields can
// be added later.

func (h *requestHeader) appendMsgpack(b []byte) []byte {
	b = append(b, 0x80|byte(4+btoi(h.RawLen != 0)+btoi(h.Stream)+btoi(h.NoLZ4)+btoi(h.Side != 0)+btoi(h.SideBody)))
	b = appendStr(b, "arg_len")
	b = appendInt(b, h.ArgLen)
	b = appendStr(b, "body_len")
	b = appendInt(b, h.BodyLen)
	b = appendStr(b, "method")
	b = appendStr(b, h.Method)
	if h.RawLen != 0 {
		b = appendStr(b, "raw_len")
		b = appendInt(b, h.RawLen)
	}
	if h.Side != 0 {
		b = appendStr(b, "side")
		b = appendInt(b, h.Side)
	}
	if h.SideBody {
		b = appendStr(b, "side_body")
		b = append(b, 0xc3)
	}
	if h.Stream {
		b = appendStr(b, "stream")
		b = append(b, 0xc3)
	}
	b = appendStr(b, "timeout_us")
	b = appendInt(b, h.TimeoutUS)
	if h.NoLZ4 {
		b = appendStr(b, "uncompressed")
		b = append(b, 0xc3)
	}
	return b
}

func (h *responseHeader) appendMsgpack(b []byte) []byte {
	b = append(b, 0x80|byte(4+btoi(h.RawLen != 0)+btoi(h.Reason != "")))
	b = appendStr(b, "arg_len")
	b = appendInt(b, h.ArgLen)
	b = appendStr(b, "body_len")
	b = appendInt(b, h.BodyLen)
	b = appendStr(b, "code")
	b = appendInt(b, int64(h.Code))
	b = appendStr(b, "message")
	b = appendStr(b, h.Message)
	if h.RawLen != 0 {
		b = appendStr(b, "raw_len")
		b = appendInt(b, h.RawLen)
	}
	if h.Reason != "" {
		b = appendStr(b, "reason")
		b = appendStr(b, h.Reason)
	}
	return b
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

func (h *requestHeader) decodeMsgpack(b []byte) error {
	d := headerReader(b)
	for d.next() {
		switch string(d.key) {
		case "arg_len":
			h.ArgLen = d.int()
		case "body_len":
			h.BodyLen = d.int()
		case "method":
			h.Method = d.str()
		case "timeout_us":
			h.TimeoutUS = d.int()
		case "raw_len":
			h.RawLen = d.int()
		case "stream":
			h.Stream = d.bool()
		case "uncompressed":
			h.NoLZ4 = d.bool()
		case "side":
			h.Side = d.int()
		case "side_body":
			h.SideBody = d.bool()
		default:
			d.skip()
		}
	}
	return d.end()
}

func (h *responseHeader) decodeMsgpack(b []byte) error {
	d := headerReader(b)
	for d.next() {
		switch string(d.key) {
		case "arg_len":
			h.ArgLen = d.int()
		case "body_len":
			h.BodyLen = d.int()
		case "code":
			c := d.int()
			if c < 0 || c > math.MaxUint8 {
				d.fail("code %d", c)
			}
			h.Code = uint8(c)
		case "message":
			h.Message = d.str()
		case "reason":
			h.Reason = d.str()
		case "raw_len":
			h.RawLen = d.int()
		default:
			d.skip()
		}
	}
	return d.end()
}

// header is what writeFrame and readHeader carry.
type header interface {
	appendMsgpack([]byte) []byte
	decodeMsgpack([]byte) error
}

// appendStr appends s as a msgpack str in its smallest form.
func appendStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = append(b, 0xdb)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
	}
	return append(b, s...)
}

// appendInt appends v as go-msgpack writes a Go int64: a fixint when it
// fits, else the smallest signed int type.
func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0 && v <= 127, v < 0 && v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8 && v <= math.MaxInt8:
		return append(b, 0xd0, byte(v))
	case v >= math.MinInt16 && v <= math.MaxInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

// msgReader reads the msgpack types headers use. After the first error
// every read returns a zero value and err keeps the error.
//
// A header is read as: headerReader(b), then next() for each key, whose
// value the caller reads (or skips) before the next key, then end(). The
// reader lives on the caller's stack, and keys are compared without
// conversion to strings: decoding a header allocates nothing but the
// strings it keeps.
type msgReader struct {
	b    []byte
	err  error
	left int    // keys left in the map
	key  []byte // the current key, aliasing b
}

// headerReader returns a reader of b, which must hold exactly one msgpack
// map with string keys.
func headerReader(b []byte) msgReader {
	d := msgReader{b: b}
	d.left = d.mapLen()
	return d
}

// next reads the map's next key into d.key, and reports false at the end
// of the map or after an error.
func (d *msgReader) next() bool {
	if d.left == 0 || d.err != nil {
		return false
	}
	d.left--
	d.key = d.strBytes()
	return d.err == nil
}

// end returns the error of the header's decoding, errProtocol.
func (d *msgReader) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes after the header", len(d.b))
	}
	if d.err != nil {
		return fmt.Errorf("%w: header: %v", errProtocol, d.err)
	}
	return nil
}

func (d *msgReader) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
	d.b = nil
}

// take returns the next n bytes.
func (d *msgReader) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *msgReader) byte() byte {
	p := d.take(1)
	if p == nil {
		return 0
	}
	return p[0]
}

func (d *msgReader) uint(n int) uint64 {
	p := d.take(n)
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v
}

func (d *msgReader) mapLen() int {
	switch c := d.byte(); {
	case c&0xf0 == 0x80:
		return int(c & 0x0f)
	case c == 0xde:
		return int(d.uint(2))
	case c == 0xdf:
		return int(d.uint(4))
	default:
		d.fail("not a map (0x%02x)", c)
		return 0
	}
}

func (d *msgReader) str() string { return string(d.strBytes()) }

func (d *msgReader) bool() bool {
	switch c := d.byte(); c {
	case 0xc2:
		return false
	case 0xc3:
		return true
	default:
		d.fail("not a boolean (0x%02x)", c)
		return false
	}
}

// strBytes returns a string's bytes, aliasing the input.
func (d *msgReader) strBytes() []byte {
	var n int
	switch c := d.byte(); {
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9, c == 0xc4:
		n = int(d.uint(1))
	case c == 0xda, c == 0xc5:
		n = int(d.uint(2))
	case c == 0xdb, c == 0xc6:
		n = int(d.uint(4))
	default:
		d.fail("not a string (0x%02x)", c)
		return nil
	}
	return d.take(n)
}

func (d *msgReader) int() int64 {
	switch c := d.byte(); {
	case c <= 0x7f:
		return int64(c)
	case c >= 0xe0:
		return int64(int8(c))
	case c == 0xcc:
		return int64(d.uint(1))
	case c == 0xcd:
		return int64(d.uint(2))
	case c == 0xce:
		return int64(d.uint(4))
	case c == 0xcf:
		v := d.uint(8)
		if v > math.MaxInt64 {
			d.fail("integer %d out of range", v)
		}
		return int64(v)
	case c == 0xd0:
		return int64(int8(d.uint(1)))
	case c == 0xd1:
		return int64(int16(d.uint(2)))
	case c == 0xd2:
		return int64(int32(d.uint(4)))
	case c == 0xd3:
		return int64(d.uint(8))
	default:
		d.fail("not an integer (0x%02x)", c)
		return 0
	}
}

// skip skips one value of any type headers could hold in future versions:
// nil, booleans, numbers, strings, binaries, and arrays and maps of them.
func (d *msgReader) skip() { d.skipDepth(0) }

func (d *msgReader) skipDepth(depth int) {
	if depth > 8 {
		d.fail("nesting too deep")
		return
	}
	c := d.byte()
	switch {
	case d.err != nil:
	case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
	case c&0xe0 == 0xa0:
		d.take(int(c & 0x1f))
	case c&0xf0 == 0x90, c&0xf0 == 0x80:
		n := int(c & 0x0f)
		if c&0xf0 == 0x80 {
			n *= 2
		}
		for range n {
			d.skipDepth(depth + 1)
		}
	case c == 0xcc, c == 0xd0:
		d.take(1)
	case c == 0xcd, c == 0xd1:
		d.take(2)
	case c == 0xce, c == 0xd2, c == 0xca:
		d.take(4)
	case c == 0xcf, c == 0xd3, c == 0xcb:
		d.take(8)
	case c == 0xd9, c == 0xc4:
		d.take(int(d.uint(1)))
	case c == 0xda, c == 0xc5:
		d.take(int(d.uint(2)))
	case c == 0xdb, c == 0xc6:
		d.take(int(d.uint(4)))
	case c == 0xdc, c == 0xdd, c == 0xde, c == 0xdf:
		var n int
		if c == 0xdc || c == 0xde {
			n = int(d.uint(2))
		} else {
			n = int(d.uint(4))
		}
		if c >= 0xde {
			n *= 2
		}
		if n > len(d.b) { // every element takes at least a byte
			d.fail("truncated")
			return
		}
		for range n {
			d.skipDepth(depth + 1)
		}
	default:
		d.fail("unsupported type 0x%02x", c)
	}
}
