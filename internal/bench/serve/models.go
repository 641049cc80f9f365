package serve

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/serve/mlp"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The models.
const (
	modelMLP  = "mlp"
	modelFake = "fake"
)

// sizes are the MLP's layers, as torch_spread's benchmark had them.
var sizes = []int{64, 256, 16}

// The fake model's cost: fakeBase plus fakePerRow per row of a batch,
// slept (sleepFor), so that it uses no CPU (as a model on an accelerator)
// and costs the same in every run.
const (
	fakeBase   = time.Millisecond
	fakePerRow = 5 * time.Microsecond
)

// fakeModel sleeps as long as a batch costs and returns zeros. As a
// serve.Loader it copies its parameters' tensor "w" into its own memory,
// as PyTorch's load_state_dict copies into a module's tensors.
type fakeModel struct {
	w []byte
}

func (f *fakeModel) Forward(_ context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	start := time.Now()
	n := in.BatchSize()[0]
	out, err := schemaOut().Zeros(n)
	if err != nil {
		return nil, err
	}
	sleepFor(time.Until(start.Add(fakeBase + time.Duration(n)*fakePerRow)))
	return out, nil
}

func (f *fakeModel) Load(_ context.Context, params *tensordict.TensorDict) error {
	w, err := params.Tensor("w")
	if err != nil {
		return err
	}
	b, err := w.Bytes()
	if err != nil {
		return err
	}
	if len(f.w) != len(b) {
		f.w = make([]byte, len(b))
	}
	copy(f.w, b)
	return nil
}

// schemaIn and schemaOut are both models' rows.
func schemaIn() tensordict.RowSchema {
	return tensordict.RowSchema{{Key: []string{mlp.DefaultIn}, DType: memmap.Float32, Shape: []int{sizes[0]}}}
}

func schemaOut() tensordict.RowSchema {
	return tensordict.RowSchema{{Key: []string{mlp.DefaultOut}, DType: memmap.Float32, Shape: []int{sizes[len(sizes)-1]}}}
}

// newModel returns a constructor of the model named kind, and the
// parameters to load into it first (nil for none).
func newModel(kind string) (func(int) (serve.Model, error), *tensordict.TensorDict, error) {
	switch kind {
	case modelMLP:
		return func(int) (serve.Model, error) { return mlp.New(mlp.Config{Sizes: sizes}) }, mlp.Random(sizes, 1), nil
	case modelFake:
		return func(int) (serve.Model, error) { return &fakeModel{}, nil }, nil, nil
	case modelPyMLP, modelPyNull, modelPyBig: // Python replicas attach to the node
		return nil, nil, nil
	}
	return nil, nil, fmt.Errorf("unknown model %q", kind)
}

// fakeParams returns parameters of mb MiB for the fake model: "w", random
// bytes.
func fakeParams(mb int, seed uint64) (*tensordict.TensorDict, error) {
	w, err := tensordict.Zeros(memmap.Uint8, mb<<20)
	if err != nil {
		return nil, err
	}
	b, _ := w.Bytes()
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	td, _ := tensordict.New()
	return td, td.Set("w", w)
}

// inputRows returns n rows of the models' input, drawn from seed.
func inputRows(n int, seed uint64) (*tensordict.TensorDict, error) {
	rng := rand.New(rand.NewPCG(seed, 2))
	xs := make([]float32, n*sizes[0])
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	x, err := tensordict.FromSlice(xs, n, sizes[0])
	if err != nil {
		return nil, err
	}
	td, _ := tensordict.New(n)
	return td, td.Set(mlp.DefaultIn, x)
}

// limit measures the model's forward throughput in this process, in rows
// per second: replicas goroutines, each with its own model, running
// batches of maxBatch rows for d. It also returns the mean time of one
// forward.
func limit(kind string, maxBatch, replicas int, d time.Duration) (rowsPerS float64, perForward time.Duration, err error) {
	build, params, err := newModel(kind)
	if err != nil {
		return 0, 0, err
	}
	in, err := inputRows(maxBatch, 99)
	if err != nil {
		return 0, 0, err
	}
	var mu sync.Mutex
	var rows, forwards int64
	var errs []error
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i := range replicas {
		wg.Go(func() {
			m, err := build(i)
			if err == nil && params != nil {
				err = m.(serve.Loader).Load(context.Background(), params)
			}
			var n, f int64
			for err == nil && time.Now().Before(deadline) {
				if _, err = m.Forward(context.Background(), in); err == nil {
					n, f = n+int64(maxBatch), f+1
				}
			}
			mu.Lock()
			rows, forwards = rows+n, forwards+f
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(start)
	if len(errs) > 0 {
		return 0, 0, errs[0]
	}
	if forwards == 0 {
		return 0, 0, fmt.Errorf("no forward finished in %v", d)
	}
	return float64(rows) / took.Seconds(), took * time.Duration(replicas) / time.Duration(forwards), nil
}
