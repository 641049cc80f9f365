package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// pipeline turns dataset rows into batch rows: the gather from the
// dataset's mapping, the transform, the index field. A Producer and a
// Local loader run the same one, so they serve the same samples.
type pipeline struct {
	src        *source
	seed       uint64
	sequential bool
	transform  Transform
	indexKey   string
	schema     tensordict.RowSchema // of the output rows, the index field last

	scratch *tensordict.TensorDict // the gathered input rows, before the transform; nil without one
	rows    Rows
	workers []Rows // each transform worker's (Config.Workers, a ConcurrentTransform); nil: one, rows
}

// newPipeline opens the dataset of cfg and works out the output fields;
// maxRows bounds the rows of one call of fill.
func newPipeline(cfg Config, maxRows int) (*pipeline, error) {
	src, err := openSource(cfg.Dataset)
	if err != nil {
		return nil, err
	}
	p := &pipeline{src: src, seed: cfg.Seed, sequential: cfg.Sequential, transform: cfg.Transform, indexKey: cfg.IndexKey}
	if ct, ok := cfg.Transform.(ConcurrentTransform); ok && cfg.Workers > 1 && ct.Concurrent() {
		p.workers = make([]Rows, cfg.Workers)
	}
	fail := func(err error) (*pipeline, error) {
		src.close()
		return nil, err
	}
	p.schema = src.schema
	if p.transform != nil {
		if p.schema, err = p.transform.Schema(src.schema.Clone()); err != nil {
			return fail(fmt.Errorf("%w: %s: %w", ErrDataset, cfg.Dataset, err))
		}
		if err := p.schema.Validate(); err != nil {
			return fail(fmt.Errorf("%w: %s: the transform's schema: %w", ErrDataset, cfg.Dataset, err))
		}
		if p.scratch, err = src.schema.Zeros(maxRows); err != nil {
			return fail(err)
		}
	}
	if p.indexKey != "" {
		for _, f := range p.schema {
			if f.Key[0] == p.indexKey {
				return fail(fmt.Errorf("%w: index key %q: the batches have a field %s already", ErrConfig, p.indexKey, strings.Join(f.Key, "/")))
			}
		}
		p.schema = append(p.schema.Clone(), tensordict.RowField{Key: []string{p.indexKey}, DType: memmap.Int64})
	}
	return p, nil
}

func (p *pipeline) close() error { return p.src.close() }

// len returns the number of samples in an epoch.
func (p *pipeline) len() int { return p.src.n }

// order returns epoch's order of the dataset rows.
func (p *pipeline) order(epoch int64) []int {
	return order(p.src.n, p.seed, epoch, !p.sequential)
}

// fill writes the samples at positions first.. of epoch, dataset rows idx,
// into dst, a TensorDict with the output fields and len(idx) rows (a
// Go-memory batch or a view of a ring slot). A fault on a mapping (the
// dataset's file truncated under it) is an error, not a crash.
func (p *pipeline) fill(dst *tensordict.TensorDict, epoch int64, first int, idx []int) (err error) {
	n := len(idx)
	if p.transform == nil {
		if err := gatherRows(dst, p.src.td, idx); err != nil {
			return err
		}
	} else {
		in, err := p.scratch.Slice(0, n)
		if err != nil {
			return err
		}
		if err := gatherRows(in, p.src.td, idx); err != nil {
			return err
		}
		if err := p.apply(dst, in, epoch, first, idx); err != nil {
			return fmt.Errorf("loader: transform: %w", err)
		}
	}
	if p.indexKey != "" {
		t, err := dst.Tensor(p.indexKey)
		if err != nil {
			return err
		}
		b, err := t.Bytes()
		if err != nil {
			return err
		}
		if len(b) != 8*n {
			return fmt.Errorf("loader: index field of %d bytes for %d rows", len(b), n)
		}
		return guard(func() error {
			for i, r := range idx {
				binary.LittleEndian.PutUint64(b[8*i:], uint64(r))
			}
			return nil
		})
	}
	return nil
}

// apply runs the transform on in's rows into dst: on this goroutine, or
// split among the workers, each on a share of the rows (contiguous, in
// order), waiting for all. The first error is returned.
func (p *pipeline) apply(dst, in *tensordict.TensorDict, epoch int64, first int, idx []int) error {
	n := len(idx)
	w := min(len(p.workers), n)
	if w <= 1 {
		p.rows = Rows{Epoch: epoch, First: first, Index: idx, seed: p.seed, rng: p.rows.rng}
		return guard(func() error { return p.transform.Apply(dst, in, &p.rows) })
	}
	type part struct{ dst, src *tensordict.TensorDict }
	parts := make([]part, w)
	for k := range w {
		lo, hi := k*n/w, (k+1)*n/w
		d, err := dst.Slice(lo, hi)
		if err != nil {
			return err
		}
		s, err := in.Slice(lo, hi)
		if err != nil {
			return err
		}
		parts[k] = part{d, s}
		r := &p.workers[k]
		*r = Rows{Epoch: epoch, First: first + lo, Index: idx[lo:hi], seed: p.seed, rng: r.rng}
	}
	errs := make([]error, w)
	var wg sync.WaitGroup
	for k, sh := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = guard(func() error { return p.transform.Apply(sh.dst, sh.src, &p.workers[k]) })
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// gatherRows copies rows idx of src, a mapped TensorDict, into the first
// len(idx) rows of dst's tensors of the same keys, straight from one
// mapping to the other (or to Go memory). dst may have more keys.
func gatherRows(dst, src *tensordict.TensorDict, idx []int) error {
	for path, st := range src.Leaves() {
		dt, err := dst.Tensor(path...)
		if err != nil {
			return err
		}
		b, err := dt.Bytes()
		if err != nil {
			return err
		}
		rb := st.RowBytes()
		if len(b) < len(idx)*rb || dt.DType() != st.DType() {
			return fmt.Errorf("loader: %s: %d rows of %v %v into %v %v", strings.Join(path, "/"), len(idx), st.DType(), st.Shape(), dt.DType(), dt.Shape())
		}
		mm, off := st.Mapping()
		if mm == nil {
			g, err := st.Gather(idx)
			if err != nil {
				return err
			}
			if err := dt.SetSlice(0, g); err != nil {
				return err
			}
			continue
		}
		if err := mm.GatherAt(b[:len(idx)*rb], off, rb, idx); err != nil {
			return err
		}
	}
	return nil
}

// guard runs fn, turning a fault on a mapping (SIGBUS on a truncated file)
// into an error, as memmap does for its own accesses, and a panic (in a
// transform) into an error too.
func guard(fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if f, ok := r.(interface{ Addr() uintptr }); ok {
				err = fmt.Errorf("%w: at address %#x (was a file truncated?)", memmap.ErrFault, f.Addr())
				return
			}
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn()
}
