package tensordict

import (
	"fmt"
	"slices"

	"github.com/tensorwire/tensorwire/memmap"
)

// Field describes one tensor of a TensorDict to Create: its key (nested
// keys as several elements), dtype and full shape, batch dimensions
// included. A schema of rows, without the batch dimensions, is a RowSchema.
//
// It encodes as JSON and on the rpc wire as {"key", "dtype", "shape"}, the
// dtype as its torch name (docs/protocol.md).
type Field struct {
	Key   []string     `json:"key"`
	DType memmap.DType `json:"dtype"`
	Shape []int        `json:"shape"` // the full shape
}

// Create makes zero-filled, memory-mapped storage at prefix for a
// TensorDict of the given batch size and fields, and returns it mapped
// read-write; the caller must Close it. Nothing is allocated in Go memory:
// a dataset far larger than RAM is created at the cost of reserving its
// disk blocks. It is MemmapLike for a schema instead of a TensorDict.
func Create(prefix string, batch []int, fields ...Field) (*TensorDict, error) {
	return create(prefix, batch, fields)
}

// CreateUnsynced is Create with Unsynced: the files and meta.json are laid
// out in the same order and every process sees them at once, but nothing
// is flushed or synced, for a writer that fills the files and then makes
// the whole prefix durable with one SyncPrefix (rpc's PlaceBytes).
func CreateUnsynced(prefix string, batch []int, fields ...Field) (*TensorDict, error) {
	return create(prefix, batch, fields, Unsynced())
}

func create(prefix string, batch []int, fields []Field, opts ...WriteOption) (*TensorDict, error) {
	td, err := New(batch...)
	if err != nil {
		return nil, err
	}
	for _, f := range fields {
		if _, err := memmap.NumBytes(f.DType, f.Shape); err != nil {
			return nil, fmt.Errorf("create %s: %s: %w", prefix, keyString(f.Key), err)
		}
		// A placeholder with no storage: MemmapLike reads only its dtype
		// and shape, and it never leaves this function.
		placeholder := &Tensor{dtype: f.DType, shape: slices.Clone(f.Shape)}
		if err := td.SetPath(f.Key, placeholder); err != nil {
			return nil, fmt.Errorf("create %s: %w", prefix, err)
		}
	}
	return td.MemmapLike(prefix, opts...)
}

// Schema returns the fields of td's tensors, in the order Leaves visits
// them: with BatchSize, what Create needs to make storage like td's.
func (td *TensorDict) Schema() []Field {
	var fs []Field
	for p, t := range td.Leaves() {
		fs = append(fs, Field{Key: p, DType: t.dtype, Shape: t.Shape()})
	}
	return fs
}
