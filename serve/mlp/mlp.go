// Package mlp is a multilayer perceptron in Go on gorgonia.org/tensor, whose
// weights PyTorch writes: the example model of package serve, and of
// "tensorwire bench serve" and "tensorwire node --serve".
//
// It computes what PyTorch's
//
//	nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16))
//
// computes (any number of layers: a ReLU between each two), in float32,
// and reads its weights from a TensorDict as
//
//	TensorDict(model.state_dict(), batch_size=[]).memmap_(prefix)
//
// writes them: keys "0.weight" (shape [out, in], as nn.Linear keeps it),
// "0.bias" ([out]), "2.weight", "2.bias", ... the number being the layer's
// index in the Sequential. Load copies the tensors it is given into the
// model's own memory, under the memmap fault guard: a weights file
// truncated under its mapping is an error at Load that names the file
// (memmap.ErrFault), never a SIGBUS in a later Forward, and the parameters
// need not outlive the Load. The matrix products go to gonum's BLAS, which
// reads a weight [out, in] transposed in place.
//
// A new MLP has zero weights, which compute nothing useful: until its
// first Load, NeedsParams reports true, and a serve.Manager of MLPs
// refuses predictions (serve.ErrNoParams) until it has loaded parameters.
package mlp

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
	"gorgonia.org/tensor"
)

// Default keys of the input and output rows.
const (
	DefaultIn  = "obs"
	DefaultOut = "logits"
)

// Config describes an MLP.
type Config struct {
	// Sizes are the layers' widths, the input's first: {64, 256, 16} is
	// Linear(64, 256), ReLU, Linear(256, 16). At least two.
	Sizes []int
	// In and Out are the keys of the input and output tensors; default
	// DefaultIn and DefaultOut.
	In, Out []string
}

// MLP is the model. Its weights are zero until Load. It is a serve.Loader:
// Forward and Load must not be called concurrently.
type MLP struct {
	cfg    Config
	layers []layer
	loaded bool                 // Load has succeeded: the weights are not New's zeros
	hidden []*tensordict.Tensor // reused activations of the hidden layers
}

type layer struct {
	in, out int
	w       *tensor.Dense      // [out, in], viewed transposed: [in, out]
	wt      *tensordict.Tensor // w's memory: kept reachable (gorgonia's view holds a bare address)
	b       []float32          // [out]
}

// New returns an MLP of cfg's shape with zero weights.
func New(cfg Config) (*MLP, error) {
	if len(cfg.Sizes) < 2 {
		return nil, fmt.Errorf("mlp: sizes %v; want at least an input and an output width", cfg.Sizes)
	}
	for _, s := range cfg.Sizes {
		if s < 1 || s > 1<<20 {
			return nil, fmt.Errorf("mlp: sizes %v; each must be 1 to %d", cfg.Sizes, 1<<20)
		}
	}
	if len(cfg.In) == 0 {
		cfg.In = []string{DefaultIn}
	}
	if len(cfg.Out) == 0 {
		cfg.Out = []string{DefaultOut}
	}
	cfg.Sizes, cfg.In, cfg.Out = slices.Clone(cfg.Sizes), slices.Clone(cfg.In), slices.Clone(cfg.Out)
	m := &MLP{cfg: cfg}
	if err := m.load(Zeros(cfg.Sizes)); err != nil {
		return nil, err
	}
	return m, nil
}

// NeedsParams reports whether the model still has New's zero weights: no
// Load has succeeded (serve.ParamsNeeder).
func (m *MLP) NeedsParams() bool { return !m.loaded }

// Input returns the schema of one input row: In, float32 [Sizes[0]].
func (m *MLP) Input() tensordict.RowSchema {
	return tensordict.RowSchema{{Key: slices.Clone(m.cfg.In), DType: memmap.Float32, Shape: []int{m.cfg.Sizes[0]}}}
}

// Output returns the schema of one output row: Out, float32 [last size].
func (m *MLP) Output() tensordict.RowSchema {
	return tensordict.RowSchema{{Key: slices.Clone(m.cfg.Out), DType: memmap.Float32, Shape: []int{m.cfg.Sizes[len(m.cfg.Sizes)-1]}}}
}

// Load makes params the model's weights: a TensorDict with a float32
// "K.weight" of shape [out, in] and "K.bias" of shape [out] for each layer,
// K its index in PyTorch's Sequential (0, 2, 4, ... with ReLUs between),
// the layers' shapes those of the model; other keys are ignored. It copies
// the tensors into the model's own memory (a mapping's bytes under the
// memmap fault guard: a file truncated under it is an error wrapping
// memmap.ErrFault that names it), so params may change or close once Load
// returns. A refused params leaves the weights as they were.
func (m *MLP) Load(_ context.Context, params *tensordict.TensorDict) error {
	if err := m.load(params); err != nil {
		return err
	}
	m.loaded = true
	return nil
}

func (m *MLP) load(params *tensordict.TensorDict) error {
	found, err := linearKeys(params)
	if err != nil {
		return err
	}
	if want := len(m.cfg.Sizes) - 1; len(found) != want {
		return fmt.Errorf("mlp: the parameters hold %d linear layers (%v); the model has %d", len(found), found, want)
	}
	layers := make([]layer, len(found))
	for i, k := range found {
		in, out := m.cfg.Sizes[i], m.cfg.Sizes[i+1]
		w, err := float32Tensor(params, k+".weight", out, in)
		if err != nil {
			return err
		}
		b, err := float32Tensor(params, k+".bias", out)
		if err != nil {
			return err
		}
		// Copies in Go memory: a fault reading a mapping is an error
		// here, and nothing of params is kept.
		if w, err = w.Clone(); err != nil {
			return fmt.Errorf("mlp: copying %s.weight: %w", k, err)
		}
		if b, err = b.Clone(); err != nil {
			return fmt.Errorf("mlp: copying %s.bias: %w", k, err)
		}
		wd, err := w.Dense()
		if err != nil {
			return fmt.Errorf("mlp: %s.weight: %w", k, err)
		}
		// A transposed view: no data moves, and MatMul passes the
		// transpose to BLAS.
		wd.T()
		bb, err := b.Bytes()
		if err != nil {
			return fmt.Errorf("mlp: %s.bias: %w", k, err)
		}
		bias, err := float32s(bb)
		if err != nil {
			return fmt.Errorf("mlp: %s.bias: %w", k, err)
		}
		layers[i] = layer{in: in, out: out, w: wd, wt: w, b: bias}
	}
	m.layers = layers
	return nil
}

// linearKeys returns the layer indices of params' "K.weight" keys, in
// order, checking each has its "K.bias".
func linearKeys(params *tensordict.TensorDict) ([]string, error) {
	if params == nil {
		return nil, fmt.Errorf("mlp: no parameters")
	}
	var idx []int
	for _, k := range params.Keys() {
		num, ok := strings.CutSuffix(k, ".weight")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(num)
		if err != nil || i < 0 || strconv.Itoa(i) != num {
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return nil, fmt.Errorf("mlp: the parameters hold no \"K.weight\" (keys %v)", params.Keys())
	}
	sort.Ints(idx)
	keys := make([]string, len(idx))
	for i, k := range idx {
		keys[i] = strconv.Itoa(k)
	}
	return keys, nil
}

// float32Tensor returns params' tensor key, checking its dtype and shape.
func float32Tensor(params *tensordict.TensorDict, key string, shape ...int) (*tensordict.Tensor, error) {
	t, err := params.Tensor(key)
	if err != nil {
		return nil, fmt.Errorf("mlp: %w", err)
	}
	if t.DType() != memmap.Float32 || !slices.Equal(t.Shape(), shape) {
		return nil, fmt.Errorf("mlp: %s is %v %v; want torch.float32 %v", key, t.DType(), t.Shape(), shape)
	}
	return t, nil
}

// SizesOf returns the layer widths of the parameters params, as Config.Sizes
// takes them: for a state_dict of Linear(64, 256), ReLU, Linear(256, 16),
// {64, 256, 16}.
func SizesOf(params *tensordict.TensorDict) ([]int, error) {
	keys, err := linearKeys(params)
	if err != nil {
		return nil, err
	}
	var sizes []int
	for i, k := range keys {
		t, err := params.Tensor(k + ".weight")
		if err != nil {
			return nil, fmt.Errorf("mlp: %w", err)
		}
		s := t.Shape()
		if len(s) != 2 {
			return nil, fmt.Errorf("mlp: %s.weight has shape %v; want [out, in]", k, s)
		}
		if i == 0 {
			sizes = append(sizes, s[1])
		} else if s[1] != sizes[i] {
			return nil, fmt.Errorf("mlp: %s.weight takes %d inputs; the layer before gives %d", k, s[1], sizes[i])
		}
		sizes = append(sizes, s[0])
	}
	return sizes, nil
}

// Forward computes the outputs of a batch: in holds In, float32 [n,
// Sizes[0]]; the result holds Out, float32 [n, last size], in new memory.
func (m *MLP) Forward(_ context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	x, err := in.Tensor(m.cfg.In...)
	if err != nil {
		return nil, fmt.Errorf("mlp: %w", err)
	}
	shape := x.Shape()
	if x.DType() != memmap.Float32 || len(shape) != 2 || shape[1] != m.cfg.Sizes[0] {
		return nil, fmt.Errorf("mlp: input %v %v; want torch.float32 [n %d]", x.DType(), shape, m.cfg.Sizes[0])
	}
	n := shape[0]
	h, err := x.Dense()
	if err != nil {
		return nil, fmt.Errorf("mlp: %w", err)
	}
	var y *tensordict.Tensor
	for i, l := range m.layers {
		last := i == len(m.layers)-1
		if last {
			y, err = tensordict.Zeros(memmap.Float32, n, l.out)
		} else {
			y, err = m.scratch(i, n, l.out)
		}
		if err != nil {
			return nil, err
		}
		yd, err := y.Dense()
		if err != nil {
			return nil, err
		}
		if err := matMul(h, l.w, yd); err != nil {
			return nil, fmt.Errorf("mlp: layer %d: %w", i, err)
		}
		ys := yd.Data().([]float32)
		for r := range n {
			row := ys[r*l.out : (r+1)*l.out]
			for j, b := range l.b {
				v := row[j] + b
				if !last && v < 0 {
					v = 0
				}
				row[j] = v
			}
		}
		h = yd
	}
	out, err := tensordict.New(n)
	if err != nil {
		return nil, err
	}
	if err := out.SetPath(m.cfg.Out, y); err != nil {
		return nil, err
	}
	return out, nil
}

// matMul sets y = h w, turning a gorgonia panic into an error.
func matMul(h, w, y *tensor.Dense) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("gorgonia: %v", p)
		}
	}()
	_, err = tensor.MatMul(h, w, tensor.WithReuse(y))
	return err
}

// scratch returns hidden layer i's activations for n rows, reusing the
// memory of earlier calls.
func (m *MLP) scratch(i, n, width int) (*tensordict.Tensor, error) {
	for len(m.hidden) <= i {
		m.hidden = append(m.hidden, nil)
	}
	t := m.hidden[i]
	if t == nil || t.Shape()[0] < n {
		var err error
		if t, err = tensordict.Zeros(memmap.Float32, max(n, 16), width); err != nil {
			return nil, err
		}
		m.hidden[i] = t
	}
	return t.Slice(0, n)
}

// Zeros returns parameters of the given layer widths, all zero, keyed as
// PyTorch's state_dict keys a Sequential of Linear and ReLU layers.
func Zeros(sizes []int) *tensordict.TensorDict {
	td, _ := tensordict.New()
	for i := range len(sizes) - 1 {
		w, _ := tensordict.Zeros(memmap.Float32, sizes[i+1], sizes[i])
		b, _ := tensordict.Zeros(memmap.Float32, sizes[i+1])
		td.Set(strconv.Itoa(2*i)+".weight", w)
		td.Set(strconv.Itoa(2*i)+".bias", b)
	}
	return td
}

// Random returns parameters of the given layer widths drawn as PyTorch
// initializes nn.Linear (uniform in ±1/sqrt(in), weights and biases), from
// a generator seeded with seed: the same seed gives the same parameters.
func Random(sizes []int, seed uint64) *tensordict.TensorDict {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	td := Zeros(sizes)
	for i := range len(sizes) - 1 {
		bound := 1 / math.Sqrt(float64(sizes[i]))
		for _, k := range []string{".weight", ".bias"} {
			t, _ := td.Tensor(strconv.Itoa(2*i) + k)
			b, _ := t.Bytes()
			v, _ := float32s(b)
			for j := range v {
				v[j] = float32((2*rng.Float64() - 1) * bound)
			}
		}
	}
	return td
}
