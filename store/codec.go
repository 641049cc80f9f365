package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A value kept inline (in the log and in the node's memory) is one byte
// string (docs/store.md, "Inline values"):
//
//	"TWV1"
//	uint32 little-endian  header length H
//	H bytes               msgpack valueHeader
//	zero padding to a multiple of 8
//	each tensor's bytes in entry order, each padded to a multiple of 8
//
// Tensors start 8-byte aligned within the string, so a decoded TensorDict's
// tensors alias it without copying.

const valueMagic = "TWV1"

// maxValueHeader bounds a value's header: a TensorDict of thousands of keys
// fits.
const maxValueHeader = 16 << 20

type valueHeader struct {
	Batch   []int        `codec:"batch"`
	Entries []valueEntry `codec:"entries"`
}

// Entry kinds.
const (
	kindDict   = 1
	kindTensor = 2
	kindData   = 3
)

type valueEntry struct {
	Key   []string `codec:"key"`
	Kind  uint8    `codec:"kind"`
	DType string   `codec:"dtype"` // tensors
	Shape []int    `codec:"shape"` // tensors: the shape; dicts: the batch size
	Data  []byte   `codec:"data"`  // non-tensor data, JSON
}

// mh is the package's msgpack configuration, as rpc's.
var mh = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true}
	h.MapType = reflect.TypeOf(map[string]any(nil))
	h.RawToString = false
	h.MaxDepth = 32
	return h
}()

var decoders = sync.Pool{New: func() any { return codec.NewDecoderBytes(nil, mh) }}

// pooledEncoder is an encoder and the empty buffer it is left with
// between uses, so that the pool holds no reference to what it encoded.
type pooledEncoder struct {
	enc   *codec.Encoder
	empty []byte
}

var encoders = sync.Pool{New: func() any {
	e := &pooledEncoder{empty: []byte{}}
	e.enc = codec.NewEncoderBytes(&e.empty, mh)
	return e
}}

func encodeMsgpack(v any) ([]byte, error) { return encodeMsgpackInto(nil, v) }

// encodeMsgpackInto encodes v into dst's capacity, from dst[0], and
// returns the encoding: in dst's array when it fits, else in a new one.
// A nil dst starts with a small buffer that grows.
func encodeMsgpackInto(dst []byte, v any) ([]byte, error) {
	e := encoders.Get().(*pooledEncoder)
	buf := dst[:0:cap(dst)]
	if buf == nil {
		buf = make([]byte, 0, 256)
	}
	e.enc.ResetBytes(&buf)
	err := e.enc.Encode(v)
	e.empty = e.empty[:0]
	e.enc.ResetBytes(&e.empty)
	encoders.Put(e)
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// decodeMsgpack decodes b, which must hold exactly one value, into v.
func decodeMsgpack(b []byte, v any) (err error) {
	dec := decoders.Get().(*codec.Decoder)
	defer decoders.Put(dec)
	dec.ResetBytes(b)
	defer func() {
		// go-msgpack panics on some malformed input; the caller gets an
		// error, never a crash.
		if p := recover(); p != nil {
			err = fmt.Errorf("msgpack: %v", p)
		}
	}()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if n := dec.NumBytesRead(); n != len(b) {
		return fmt.Errorf("msgpack: %d bytes after the value", len(b)-n)
	}
	return nil
}

func pad8(n int) int { return (n + 7) &^ 7 }

// encodeValue returns td's inline encoding. It copies td's data (through
// ReadAt, so a mapping of td is read under its fault guard).
func encodeValue(td *tensordict.TensorDict) ([]byte, error) {
	h := valueHeader{Batch: td.BatchSize()}
	var leaves []*tensordict.Tensor
	size := 0
	for path, v := range td.Items() {
		e := valueEntry{Key: path}
		switch v := v.(type) {
		case *tensordict.TensorDict:
			e.Kind, e.Shape = kindDict, v.BatchSize()
		case *tensordict.Tensor:
			e.Kind, e.DType, e.Shape = kindTensor, v.DType().String(), v.Shape()
			leaves = append(leaves, v)
			size += pad8(v.NumBytes())
		case *tensordict.NonTensor:
			b, err := json.Marshal(v.Data)
			if err != nil {
				return nil, errorf(ErrFormat, "%q: non-tensor data: %v", path, err)
			}
			e.Kind, e.Data = kindData, b
		}
		h.Entries = append(h.Entries, e)
	}
	hb, err := encodeMsgpack(&h)
	if err != nil {
		return nil, errorf(ErrFormat, "encoding the header: %v", err)
	}
	if len(hb) > maxValueHeader {
		return nil, errorf(ErrFormat, "a header of %d bytes; at most %d", len(hb), maxValueHeader)
	}
	off := pad8(8 + len(hb))
	out := valueBuf(off + size) // not zeroed: every byte is written below
	copy(out, valueMagic)
	binary.LittleEndian.PutUint32(out[4:], uint32(len(hb)))
	copy(out[8:], hb)
	clear(out[8+len(hb) : off])
	for _, t := range leaves {
		n := t.NumBytes()
		if n > 0 {
			if _, err := t.ReadAt(out[off:off+n], 0); err != nil {
				return nil, fmt.Errorf("store: reading a tensor: %w", err)
			}
		}
		clear(out[off+n : off+pad8(n)])
		off += pad8(n)
	}
	return out, nil
}

// valueBufs holds buffers of inline values that are no longer used:
// putValue keeps an appended value in its log record's frame instead
// (aliasInline) and hands the buffer encodeValue filled back, so that a
// stream of appends does not allocate one per item.
var valueBufs sync.Pool // of *[]byte

// maxRecycled bounds the buffers valueBufs keeps.
const maxRecycled = 4 << 20

// valueBuf returns a buffer of n bytes, recycled if one is at hand; its
// bytes are not zeroed.
func valueBuf(n int) []byte {
	if p, _ := valueBufs.Get().(*[]byte); p != nil && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

// recycleValueBuf gives back a buffer from valueBuf that nothing refers
// to any more.
func recycleValueBuf(b []byte) {
	if cap(b) <= maxRecycled {
		valueBufs.Put(&b)
	}
}

// aliasInline returns the bytes of frame, a prepared record's, that hold
// the inline value v (msgpack bin), or nil if they cannot be found, and
// where in frame to look for the next value: it looks from offset from
// on (a record's values are encoded in order, so a record of many values
// is searched once, not once per value). The bytes are v's, and stay as
// they are: a frame is never changed but for its revision and checksum,
// outside the payload.
func aliasInline(frame, v []byte, from int) (alias []byte, next int) {
	if len(frame) < frameHeader+frameTrailer || len(v) < 8 {
		return nil, from
	}
	from = max(from, frameHeader)
	if from > len(frame)-frameTrailer {
		return nil, from
	}
	payload := frame[from : len(frame)-frameTrailer]
	n := len(v)
	var h []byte
	switch {
	case n <= 0xff:
		h = []byte{0xc4, byte(n)}
	case n <= 0xffff:
		h = []byte{0xc5, byte(n >> 8), byte(n)}
	default:
		h = []byte{0xc6, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	}
	i := bytes.Index(payload, append(h, v[:min(n, 32)]...))
	if i < 0 || i+len(h)+n > len(payload) {
		return nil, from
	}
	a := payload[i+len(h) : i+len(h)+n : i+len(h)+n]
	if !bytes.Equal(a, v) {
		return nil, from
	}
	return a, from + i + len(h) + n
}

// valueBytes returns the size of td's tensors, the figure the value limit
// applies to.
func valueBytes(td *tensordict.TensorDict) int64 { return int64(td.NumBytes()) }

// decodeValue returns the TensorDict encoded in b, whose tensors alias b.
// Malformed input returns an error matching ErrFormat; nothing in b can
// make it allocate much more than len(b).
func decodeValue(b []byte) (*tensordict.TensorDict, error) {
	if len(b) < 8 || string(b[:4]) != valueMagic {
		return nil, errorf(ErrFormat, "not an inline value")
	}
	hl := int(binary.LittleEndian.Uint32(b[4:]))
	if hl > maxValueHeader || hl > len(b)-8 {
		return nil, errorf(ErrFormat, "a header of %d bytes in a value of %d", hl, len(b))
	}
	var h valueHeader
	if err := decodeMsgpack(b[8:8+hl], &h); err != nil {
		return nil, errorf(ErrFormat, "header: %v", err)
	}
	td, err := tensordict.New(h.Batch...)
	if err != nil {
		return nil, errorf(ErrFormat, "batch %v: %v", h.Batch, err)
	}
	off := pad8(8 + hl)
	for _, e := range h.Entries {
		var v tensordict.Value
		switch e.Kind {
		case kindDict:
			sub, err := tensordict.New(e.Shape...)
			if err != nil {
				return nil, errorf(ErrFormat, "%q: %v", e.Key, err)
			}
			v = sub
		case kindTensor:
			dt, err := memmap.ParseDType(e.DType)
			if err != nil {
				return nil, errorf(ErrFormat, "%q: %v", e.Key, err)
			}
			n, err := memmap.NumBytes(dt, e.Shape)
			if err != nil {
				return nil, errorf(ErrFormat, "%q: %v", e.Key, err)
			}
			if off > len(b) || n > len(b)-off {
				return nil, errorf(ErrFormat, "%q: %d bytes past the value's end", e.Key, n)
			}
			x, err := tensordict.FromBytes(dt, e.Shape, b[off:off+n:off+n])
			if err != nil {
				return nil, errorf(ErrFormat, "%q: %v", e.Key, err)
			}
			off += pad8(n)
			v = x
		case kindData:
			var data any
			if err := json.Unmarshal(e.Data, &data); err != nil {
				return nil, errorf(ErrFormat, "%q: non-tensor data: %v", e.Key, err)
			}
			v = &tensordict.NonTensor{Data: data}
		default:
			return nil, errorf(ErrFormat, "%q: unknown entry kind %d", e.Key, e.Kind)
		}
		if err := td.SetPath(e.Key, v); err != nil {
			return nil, errorf(ErrFormat, "%v", err)
		}
	}
	if off != len(b) {
		return nil, errorf(ErrFormat, "%d bytes after the tensors", len(b)-off)
	}
	return td, nil
}
