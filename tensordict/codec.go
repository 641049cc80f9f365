package tensordict

import (
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/memmap"
)

// Field and RowField encode themselves for go-msgpack, the rpc package's
// codec, so that the dtype is a msgpack str holding the torch name, as
// docs/protocol.md specifies: go-msgpack would write memmap.DType's
// MarshalBinary as a bin. The bytes are those of the map below, keys in
// the order go-msgpack sorts them ("dtype", "key", "shape").

// fieldWire is a Field's or RowField's form on the wire.
type fieldWire struct {
	Key   []string `codec:"key"`
	DType string   `codec:"dtype"`
	Shape []int    `codec:"shape"`
}

// CodecEncodeSelf encodes f for go-msgpack (codec.Selfer), the dtype as a
// str. As go-msgpack's contract has it, an invalid dtype panics with an
// error wrapping memmap.ErrDType, which go-msgpack's Encode returns.
func (f Field) CodecEncodeSelf(e *codec.Encoder) { encodeField(e, f.Key, f.DType, f.Shape) }

// CodecDecodeSelf decodes f for go-msgpack (codec.Selfer). An unknown
// dtype name panics with an error wrapping memmap.ErrDType, which
// go-msgpack's Decode returns.
func (f *Field) CodecDecodeSelf(d *codec.Decoder) { f.Key, f.DType, f.Shape = decodeField(d) }

// CodecEncodeSelf encodes f for go-msgpack, as Field.CodecEncodeSelf.
func (f RowField) CodecEncodeSelf(e *codec.Encoder) { encodeField(e, f.Key, f.DType, f.Shape) }

// CodecDecodeSelf decodes f for go-msgpack, as Field.CodecDecodeSelf.
func (f *RowField) CodecDecodeSelf(d *codec.Decoder) { f.Key, f.DType, f.Shape = decodeField(d) }

func encodeField(e *codec.Encoder, key []string, dt memmap.DType, shape []int) {
	name, err := dt.MarshalText()
	if err != nil {
		panic(err)
	}
	e.MustEncode(&fieldWire{Key: key, DType: string(name), Shape: shape})
}

func decodeField(d *codec.Decoder) ([]string, memmap.DType, []int) {
	var w fieldWire
	d.MustDecode(&w)
	var dt memmap.DType
	if err := dt.UnmarshalText([]byte(w.DType)); err != nil {
		panic(err)
	}
	return w.Key, dt, w.Shape
}
