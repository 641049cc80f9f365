package loader

import (
	"fmt"
	"math/rand/v2"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// rowBytes returns the bytes of one row of f.
func rowBytes(f tensordict.RowField) int {
	return memmap.RowBytes(f.DType, append([]int{1}, f.Shape...))
}

// source is a dataset: a memory-mapped TensorDict of batch size [N, ...],
// mapped read-only, and the per-row fields of its tensors.
type source struct {
	td     *tensordict.TensorDict
	n      int
	schema tensordict.RowSchema
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
	s.schema = td.RowSchema()
	if len(s.schema) == 0 {
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
