package tensordict

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tensorwire/tensorwire/memmap"
)

// RowField describes one tensor of a row: its key (nested keys as several
// elements), dtype, and the shape of one row, without the batch
// dimensions. Field, with the full shape, is what Create takes; a
// RowSchema turns into Fields for a batch size with Fields.
//
// It encodes as JSON (replay.json) and on the rpc wire as
// {"key", "dtype", "shape"}, the dtype as its torch name (docs/protocol.md).
type RowField struct {
	Key   []string     `json:"key"`
	DType memmap.DType `json:"dtype"`
	Shape []int        `json:"shape"` // of one row: no batch dimensions
}

// String formats f as "[key] dtype[shape]", e.g. "[next obs] torch.uint8[84 84]".
func (f RowField) String() string { return fmt.Sprintf("%v %v%v", f.Key, f.DType, f.Shape) }

// RowSchema is the fields of one row: the transition of a replay buffer,
// the inputs and outputs of a served model, the sample of a loader. A batch
// of n rows is a TensorDict of batch size [n] whose tensors have the shapes
// [n, shape...] (Fields, Zeros, Create); TensorDict.RowSchema goes back.
//
// A RowSchema is a plain slice: copy it with Clone before changing one that
// is shared. Its methods only read it and are safe for concurrent use.
type RowSchema []RowField

// Validate checks s: at least one field; every key non-empty, without an
// empty element, given once, and not the parent of another field's key (a
// key holds a tensor or a nested TensorDict, not both); valid dtypes;
// shapes without negative dimensions whose rows' bytes fit an int. The
// error wraps ErrSchema and names the field.
func (s RowSchema) Validate() error {
	if len(s) == 0 {
		return fmt.Errorf("%w: no fields", ErrSchema)
	}
	seen := make(map[string]bool, len(s))
	for _, f := range s {
		if len(f.Key) == 0 || slices.Contains(f.Key, "") {
			return fmt.Errorf("%w: field with an empty key %q", ErrSchema, f.Key)
		}
		k := joinKey(f.Key)
		if seen[k] {
			return fmt.Errorf("%w: field %v twice", ErrSchema, f.Key)
		}
		seen[k] = true
		if !f.DType.Valid() {
			return fmt.Errorf("%w: field %v: %w: %v", ErrSchema, f.Key, memmap.ErrDType, f.DType)
		}
	}
	for _, f := range s {
		for i := 1; i < len(f.Key); i++ {
			if seen[joinKey(f.Key[:i])] {
				return fmt.Errorf("%w: field %v is inside field %v, which is a tensor", ErrSchema, f.Key, f.Key[:i])
			}
		}
	}
	_, err := s.NumBytes(1) // shapes, and the row's bytes
	return err
}

// joinKey makes a map key of a nested key (keys may hold any character
// but NUL, which no file name can).
func joinKey(key []string) string { return strings.Join(key, "\x00") }

// RowBytes returns the bytes of one row: the sum over the fields of the
// dtype's size times the shape's elements. It is -1 for a schema that
// Validate refuses.
func (s RowSchema) RowBytes() int {
	n, err := s.NumBytes(1)
	if err != nil {
		return -1
	}
	return n
}

// NumBytes returns the bytes of a batch of the given batch size: the sum
// over the fields of memmap.NumBytes of the dtype and the batch size
// followed by the row shape. It returns an error wrapping ErrSchema, and
// memmap.ErrDType or memmap.ErrShape, for an invalid field or a total that
// overflows an int.
func (s RowSchema) NumBytes(batch ...int) (int, error) {
	total := 0
	for _, f := range s {
		n, err := memmap.NumBytes(f.DType, concatShape(batch, f.Shape))
		if err != nil {
			return 0, fmt.Errorf("%w: field %v: %v rows of shape %v: %w", ErrSchema, f.Key, batch, f.Shape, err)
		}
		if total > math.MaxInt-n {
			return 0, fmt.Errorf("%w: %w: %v rows of %s overflow", ErrSchema, memmap.ErrShape, batch, s)
		}
		total += n
	}
	return total, nil
}

// Fields returns the Fields of a batch of s of the given batch size: each
// shape is batch followed by the row shape. The result shares no memory
// with s.
func (s RowSchema) Fields(batch ...int) []Field {
	if s == nil {
		return nil
	}
	out := make([]Field, len(s))
	for i, f := range s {
		out[i] = Field{Key: slices.Clone(f.Key), DType: f.DType, Shape: concatShape(batch, f.Shape)}
	}
	return out
}

// Zeros returns a zero-filled TensorDict in Go memory of the given batch
// size with s's fields, in s's order. The error wraps ErrSchema for a
// schema Validate refuses.
func (s RowSchema) Zeros(batch ...int) (*TensorDict, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	td, err := New(batch...)
	if err != nil {
		return nil, err
	}
	for _, f := range s {
		t, err := Zeros(f.DType, concatShape(batch, f.Shape)...)
		if err != nil {
			return nil, err
		}
		if err := td.SetPath(f.Key, t); err != nil {
			return nil, err
		}
	}
	return td, nil
}

// Create is Create(prefix, batch, s.Fields(batch...)...): zero-filled,
// memory-mapped storage at prefix for a batch of s of the given batch
// size, which the caller must Close. The error wraps ErrSchema for a
// schema Validate refuses, and nothing is created then.
func (s RowSchema) Create(prefix string, batch ...int) (*TensorDict, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("create %s: %w", prefix, err)
	}
	return Create(prefix, batch, s.Fields(batch...)...)
}

// Match returns nil if got has exactly s's fields: the same keys, each with
// the same dtype and row shape, in any order. Otherwise it returns an
// error wrapping ErrSchema that describes the first difference.
func (s RowSchema) Match(got RowSchema) error {
	byKey := make(map[string]RowField, len(s))
	for _, f := range s {
		byKey[joinKey(f.Key)] = f
	}
	for _, g := range got {
		w, ok := byKey[joinKey(g.Key)]
		switch {
		case !ok:
			return fmt.Errorf("%w: field %v is not in the schema (%s)", ErrSchema, g.Key, s)
		case w.DType != g.DType:
			return fmt.Errorf("%w: field %v has dtype %v, want %v", ErrSchema, w.Key, g.DType, w.DType)
		case !slices.Equal(w.Shape, g.Shape):
			return fmt.Errorf("%w: field %v has shape %v per row, want %v", ErrSchema, w.Key, g.Shape, w.Shape)
		}
	}
	if len(got) != len(s) {
		return fmt.Errorf("%w: %d fields, want %d (%s)", ErrSchema, len(got), len(s), s)
	}
	return nil
}

// Clone returns a copy of s that shares no memory with it; nil stays nil.
func (s RowSchema) Clone() RowSchema {
	if s == nil {
		return nil
	}
	out := make(RowSchema, len(s))
	for i, f := range s {
		out[i] = RowField{Key: slices.Clone(f.Key), DType: f.DType, Shape: slices.Clone(f.Shape)}
	}
	return out
}

// String lists the fields, e.g. "[obs] torch.uint8[4 4], [reward] torch.float32[]".
func (s RowSchema) String() string {
	var b strings.Builder
	for i, f := range s {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(f.String())
	}
	return b.String()
}

// RowSchema returns the row schema of td: its tensors in the order Leaves
// visits them, each shape without td's batch dimensions. It is nil for a
// TensorDict without tensors.
func (td *TensorDict) RowSchema() RowSchema {
	var s RowSchema
	for p, t := range td.Leaves() {
		s = append(s, RowField{Key: p, DType: t.dtype, Shape: slices.Clone(t.shape[len(td.batch):])})
	}
	return s
}

// concatShape returns a new slice holding batch followed by shape.
func concatShape(batch, shape []int) []int {
	out := make([]int, 0, len(batch)+len(shape))
	return append(append(out, batch...), shape...)
}
