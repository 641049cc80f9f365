package serve

import (
	"fmt"

	"github.com/tensorwire/tensorwire/tensordict"
)

// fields are the tensors of a TensorDict of rows, in a schema's order, and
// the bytes of one row of each: what copying rows between two TensorDicts
// of one schema needs, looked up once (a batch buffer's when it is made, a
// client's slots' when they are registered) rather than per request.
type fields struct {
	t  []*tensordict.Tensor
	rb []int
}

// fieldsOf returns td's tensors of schema's fields, in schema's order. td
// has been checked to hold them (checkRows, checkOut, mapClient).
func fieldsOf(td *tensordict.TensorDict, schema tensordict.RowSchema) (fields, error) {
	f := fields{t: make([]*tensordict.Tensor, len(schema)), rb: make([]int, len(schema))}
	for i, s := range schema {
		t, err := td.Tensor(s.Key...)
		if err != nil {
			return fields{}, schemaErrorf("%v", err)
		}
		f.t[i], f.rb[i] = t, t.RowBytes()
	}
	return f, nil
}

// copyRows copies rows [srcRow, srcRow+n) of src into rows [dstRow,
// dstRow+n) of dst, field by field: one copy of each field's bytes, read
// or written through the fault guard of whichever side is a mapping (a
// client's file a peer could truncate faults into an error, not a crash).
func copyRows(dst fields, dstRow int, src fields, srcRow, n int) error {
	for i, d := range dst.t {
		s, rb := src.t[i], dst.rb[i]
		if src.rb[i] != rb {
			return schemaErrorf("rows of %d bytes into rows of %d", src.rb[i], rb)
		}
		size := n * rb
		switch {
		case !d.Mapped():
			b, err := d.Bytes()
			if err != nil {
				return err
			}
			if _, err := s.ReadAt(b[dstRow*rb:dstRow*rb+size], int64(srcRow*rb)); err != nil {
				return fmt.Errorf("serve: reading rows: %w", err)
			}
		case !s.Mapped():
			b, err := s.Bytes()
			if err != nil {
				return err
			}
			if _, err := d.WriteAt(b[srcRow*rb:srcRow*rb+size], int64(dstRow*rb)); err != nil {
				return fmt.Errorf("serve: writing rows: %w", err)
			}
		default: // both mapped: through a buffer
			buf := make([]byte, size)
			if _, err := s.ReadAt(buf, int64(srcRow*rb)); err != nil {
				return fmt.Errorf("serve: reading rows: %w", err)
			}
			if _, err := d.WriteAt(buf, int64(dstRow*rb)); err != nil {
				return fmt.Errorf("serve: writing rows: %w", err)
			}
		}
	}
	return nil
}
