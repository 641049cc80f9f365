package loader

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Field is one tensor of a batch's rows: its key (nested keys as several
// elements), dtype and the shape of one row, without the batch dimension.
type Field struct {
	Key      []string
	DType    memmap.DType
	RowShape []int
}

// String reads "images uint8 [28 28]".
func (f Field) String() string {
	return fmt.Sprintf("%s %v %v", strings.Join(f.Key, "/"), f.DType, f.RowShape)
}

// rowBytes returns the bytes of one row of f.
func (f Field) rowBytes() int { return memmap.RowBytes(f.DType, append([]int{1}, f.RowShape...)) }

// source is a dataset: a memory-mapped TensorDict of batch size [N, ...],
// mapped read-only, and the per-row fields of its tensors.
type source struct {
	td     *tensordict.TensorDict
	n      int
	fields []Field
}

// openSource maps the TensorDict at prefix read-only. A prefix that holds
// none, or one with no rows or no tensors, is ErrDataset.
func openSource(prefix string) (*source, error) {
	if prefix == "" {
		return nil, wrapf(ErrDataset, "no dataset prefix")
	}
	td, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDataset, err)
	}
	s := &source{td: td, n: td.Len()}
	fail := func(format string, args ...any) (*source, error) {
		td.Close()
		return nil, fmt.Errorf("%w: %s: %s", ErrDataset, prefix, fmt.Sprintf(format, args...))
	}
	if len(td.BatchSize()) == 0 {
		return fail("no batch dimension: not a dataset of rows")
	}
	if s.n == 0 {
		return fail("no rows (batch size %v)", td.BatchSize())
	}
	for path, t := range td.Leaves() {
		s.fields = append(s.fields, Field{Key: path, DType: t.DType(), RowShape: t.Shape()[1:]})
	}
	if len(s.fields) == 0 {
		return fail("no tensors")
	}
	return s, nil
}

func (s *source) close() error { return s.td.Close() }

// order returns the dataset rows of epoch e in the order they are served:
// a permutation drawn from seed and e when shuffle is set, 0..n-1
// otherwise. The same seed, epoch and n give the same order in every
// process.
func order(n int, seed uint64, epoch int64, shuffle bool) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	if shuffle {
		rng := rand.New(rand.NewPCG(seed, mix(uint64(epoch))))
		rng.Shuffle(n, func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	}
	return idx
}

// mix is splitmix64's finalizer: it spreads consecutive inputs (epochs,
// positions) over the whole range before they seed a generator.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// newBatchDict makes a TensorDict in Go memory of batch size [n] with
// fields.
func newBatchDict(fields []Field, n int) (*tensordict.TensorDict, error) {
	td, err := tensordict.New(n)
	if err != nil {
		return nil, err
	}
	for _, f := range fields {
		t, err := tensordict.Zeros(f.DType, append([]int{n}, f.RowShape...)...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if err := td.SetPath(f.Key, t); err != nil {
			return nil, err
		}
	}
	return td, nil
}

// fieldsOfTD returns the per-row fields of td's tensors.
func fieldsOfTD(td *tensordict.TensorDict) []Field {
	var fs []Field
	for path, t := range td.Leaves() {
		fs = append(fs, Field{Key: path, DType: t.DType(), RowShape: t.Shape()[1:]})
	}
	return fs
}

// checkFields refuses a schema with no fields, a key given twice or a row
// shape with a negative dimension.
func checkFields(fs []Field) error {
	if len(fs) == 0 {
		return fmt.Errorf("no fields")
	}
	seen := map[string]bool{}
	for _, f := range fs {
		if len(f.Key) == 0 {
			return fmt.Errorf("a field with no key")
		}
		k := strings.Join(f.Key, "\x00")
		if seen[k] {
			return fmt.Errorf("field %s given twice", strings.Join(f.Key, "/"))
		}
		seen[k] = true
		if !f.DType.Valid() {
			return fmt.Errorf("field %s: invalid dtype", strings.Join(f.Key, "/"))
		}
		if _, err := memmap.NumBytes(f.DType, append([]int{1}, f.RowShape...)); err != nil {
			return fmt.Errorf("field %s: %w", strings.Join(f.Key, "/"), err)
		}
	}
	return nil
}

// wireFields and fieldsOfWire convert per-row fields to and from their wire
// form.
func wireFields(fs []Field) []rpc.FieldInfo {
	out := make([]rpc.FieldInfo, len(fs))
	for i, f := range fs {
		out[i] = rpc.FieldInfo{Key: f.Key, DType: f.DType.String(), Shape: f.RowShape}
	}
	return out
}

func fieldsOfWire(fi []rpc.FieldInfo) ([]Field, error) {
	out := make([]Field, len(fi))
	for i, f := range fi {
		dt, err := memmap.ParseDType(f.DType)
		if err != nil {
			return nil, fmt.Errorf("field %v: %w", f.Key, err)
		}
		out[i] = Field{Key: slices.Clone(f.Key), DType: dt, RowShape: slices.Clone(f.Shape)}
	}
	return out, checkFields(out)
}
