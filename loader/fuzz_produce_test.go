package loader

import (
	"errors"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// FuzzCopyBatch feeds the node's check of a batch a producer process sends
// as bytes (copyBatch, loader.produce) batches of any key, dtype, row shape
// and row count, beside the schema's own fields: it never panics, and it
// accepts exactly a batch of the schema's fields with the grant's rows,
// which it then copies whole.
func FuzzCopyBatch(f *testing.F) {
	f.Add("labels", uint8(memmap.Int64), uint8(0), uint8(0), uint8(16), uint8(16), false)
	f.Add("labels", uint8(memmap.Int32), uint8(0), uint8(0), uint8(16), uint8(16), false)
	f.Add("label", uint8(memmap.Int64), uint8(0), uint8(0), uint8(16), uint8(16), false)
	f.Add("labels", uint8(memmap.Int64), uint8(3), uint8(0), uint8(16), uint8(16), false)
	f.Add("labels", uint8(memmap.Int64), uint8(0), uint8(0), uint8(15), uint8(16), false)
	f.Add("labels", uint8(memmap.Int64), uint8(0), uint8(0), uint8(4), uint8(4), true)
	f.Add("images", uint8(memmap.Uint8), uint8(2), uint8(4), uint8(16), uint8(16), true)
	f.Fuzz(func(t *testing.T, key string, dt, d0, d1, rows, granted uint8, extra bool) {
		if key == "" || key == "images" || granted == 0 || granted > 16 || dt == 0 || dt > uint8(memmap.Complex128) {
			return
		}
		field := tensordict.RowField{Key: []string{key}, DType: memmap.DType(dt)}
		for _, d := range []uint8{d0, d1} {
			if d > 0 {
				field.Shape = append(field.Shape, int(d%8)+1)
			}
		}
		schema := tensordict.RowSchema{remoteSchema[0], field}
		if extra {
			schema = append(schema, tensordict.RowField{Key: []string{"extra"}, DType: memmap.Uint8})
		}
		if schema.Validate() != nil {
			return
		}
		src, err := schema.Zeros(int(rows % 32))
		if err != nil {
			return
		}
		dst, err := remoteSchema.Zeros(16)
		if err != nil {
			t.Fatal(err)
		}
		view, err := dst.Slice(0, int(granted))
		if err != nil {
			t.Fatal(err)
		}
		err = copyBatch(view, remoteSchema, src, int(granted))
		same := !extra && slices.EqualFunc(schema, remoteSchema, func(a, b tensordict.RowField) bool {
			return slices.Equal(a.Key, b.Key) && a.DType == b.DType && slices.Equal(a.Shape, b.Shape)
		}) && int(rows%32) == int(granted)
		if (err == nil) != same {
			t.Fatalf("copyBatch of %v × %d rows for %d granted: %v", schema, rows%32, granted, err)
		}
		if err != nil && !errors.Is(err, ErrArgument) {
			t.Fatalf("copyBatch: %v, want ErrArgument", err)
		}
	})
}
