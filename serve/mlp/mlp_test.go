package mlp

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/internal/testkit/torchcheck"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

var sizes = []int{64, 256, 16}

// reference is the forward pass written out: loops over the state_dict's
// weights [out, in], as PyTorch's Linear computes y = x W^T + b.
func reference(t *testing.T, params *tensordict.TensorDict, x []float32, n int) []float32 {
	t.Helper()
	h := x
	keys, err := linearKeys(params)
	if err != nil {
		t.Fatal(err)
	}
	for li, k := range keys {
		wt, _ := params.Tensor(k + ".weight")
		bt, _ := params.Tensor(k + ".bias")
		w, _ := tensordict.Values[float32](wt)
		b, _ := tensordict.Values[float32](bt)
		out, in := wt.Shape()[0], wt.Shape()[1]
		y := make([]float32, n*out)
		for r := range n {
			for o := range out {
				s := float64(b[o])
				for i := range in {
					s += float64(h[r*in+i]) * float64(w[o*in+i])
				}
				if li < len(keys)-1 && s < 0 {
					s = 0
				}
				y[r*out+o] = float32(s)
			}
		}
		h = y
	}
	return h
}

func input(t *testing.T, n int, seed float32) (*tensordict.TensorDict, []float32) {
	t.Helper()
	xs := make([]float32, n*64)
	for i := range xs {
		xs[i] = float32(math.Sin(float64(seed) + float64(i)*0.37))
	}
	x, _ := tensordict.FromSlice(xs, n, 64)
	td, _ := tensordict.New(n)
	if err := td.Set(DefaultIn, x); err != nil {
		t.Fatal(err)
	}
	return td, xs
}

func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst := 0.0
	for i := range got {
		worst = max(worst, math.Abs(float64(got[i])-float64(want[i])))
	}
	if worst > tol {
		t.Errorf("%s: differs by up to %g (tolerance %g)", what, worst, tol)
	}
}

func outputs(t *testing.T, out *tensordict.TensorDict) []float32 {
	t.Helper()
	y, err := out.Tensor(DefaultOut)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tensordict.Values[float32](y)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMLP_ForwardMatchesReference(t *testing.T) {
	m, err := New(Config{Sizes: sizes})
	if err != nil {
		t.Fatal(err)
	}
	params := Random(sizes, 7)
	if err := m.Load(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3, 16, 40} {
		in, xs := input(t, n, float32(n))
		out, err := m.Forward(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if b := out.BatchSize(); len(b) != 1 || b[0] != n {
			t.Fatalf("batch size %v for %d rows", b, n)
		}
		if err := m.Output().Match(out.RowSchema()); err != nil {
			t.Fatal(err)
		}
		closeTo(t, "forward", outputs(t, out), reference(t, params, xs, n), 1e-5)
	}
}

// TestMLP_LoadsAReadOnlyMapping loads weights from a read-only mapping:
// nothing may write into it (a write would fault); Load copies them, and
// the forward pass uses the copy, transposed by BLAS and not in memory.
func TestMLP_LoadsAReadOnlyMapping(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "params")
	params := Random(sizes, 3)
	written, err := params.Memmap(prefix)
	if err != nil {
		t.Fatal(err)
	}
	written.Close()
	mapped, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	got, err := SizesOf(mapped)
	if err != nil || len(got) != 3 || got[0] != 64 || got[1] != 256 || got[2] != 16 {
		t.Fatalf("SizesOf: %v, %v", got, err)
	}
	m, _ := New(Config{Sizes: sizes})
	if err := m.Load(context.Background(), mapped); err != nil {
		t.Fatal(err)
	}
	for range 2 { // twice: the first call must not have changed the weights
		in, xs := input(t, 5, 1)
		out, err := m.Forward(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		closeTo(t, "forward", outputs(t, out), reference(t, params, xs, 5), 1e-5)
	}
}

// TestMLP_TruncatedWeightsFailAtLoad truncates a weights file under its
// read-only mapping before Load: Load copies the weights under the memmap
// fault guard, so it fails with memmap.ErrFault naming the file, and the
// model keeps the weights it had. Before, Load kept views of the mapping
// and returned nil, and the next Forward died of SIGBUS inside BLAS. Then
// a file truncated after Load changes nothing: the model computes with
// its copy.
func TestMLP_TruncatedWeightsFailAtLoad(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "params")
	params := Random(sizes, 3)
	written, err := params.Memmap(prefix)
	if err != nil {
		t.Fatal(err)
	}
	written.Close()
	mapped, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	weight := filepath.Join(prefix, "2.weight.memmap")
	if err := os.Truncate(weight, 0); err != nil {
		t.Fatal(err)
	}
	m, _ := New(Config{Sizes: sizes})
	err = m.Load(context.Background(), mapped)
	if err == nil {
		t.Fatal("Load of a truncated weights file returned nil (a Forward would die of SIGBUS)")
	}
	if !errors.Is(err, memmap.ErrFault) || !strings.Contains(err.Error(), weight) {
		t.Errorf("Load: %v; want memmap.ErrFault naming %s", err, weight)
	}
	if !m.NeedsParams() {
		t.Error("a refused Load counts as loaded")
	}

	// Loaded, then truncated: the model has its own copy.
	written, err = params.Memmap(filepath.Join(t.TempDir(), "params"))
	if err != nil {
		t.Fatal(err)
	}
	defer written.Close()
	if err := m.Load(context.Background(), written); err != nil {
		t.Fatal(err)
	}
	if m.NeedsParams() {
		t.Error("NeedsParams after a Load")
	}
	for _, k := range params.Keys() {
		if err := os.Truncate(filepath.Join(written.Prefix(), k+".memmap"), 0); err != nil {
			t.Fatal(err)
		}
	}
	in, xs := input(t, 3, 2)
	out, err := m.Forward(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "forward after the files were truncated", outputs(t, out), reference(t, params, xs, 3), 1e-5)
}

func TestMLP_LoadRefuses(t *testing.T) {
	m, _ := New(Config{Sizes: sizes})
	good := Random(sizes, 1)
	if err := m.Load(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	f64, _ := tensordict.Zeros(memmap.Float64, 16)
	wrongDType := Random(sizes, 1)
	wrongDType.Set("2.bias", f64)
	wrongShape := Random(sizes, 1)
	w, _ := tensordict.Zeros(memmap.Float32, 64, 256) // [in, out]: transposed
	wrongShape.Set("0.weight", w)
	noBias := Random(sizes, 1)
	noBias.Delete("0.bias")
	for name, p := range map[string]*tensordict.TensorDict{
		"wrong dtype": wrongDType, "transposed weight": wrongShape, "no bias": noBias,
		"three layers": Random([]int{64, 32, 32, 16}, 1), "empty": Zeros(nil), "nil": nil,
	} {
		if err := m.Load(context.Background(), p); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	// The weights are still the good ones.
	in, xs := input(t, 2, 0)
	out, err := m.Forward(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "after refused loads", outputs(t, out), reference(t, good, xs, 2), 1e-5)
	if _, err := New(Config{Sizes: []int{64}}); err == nil {
		t.Error("New with one size succeeded")
	}
}

// python returns an interpreter that can import torch, the one
// internal/testkit/torchcheck runs ($TENSORWIRE_PYTHON when set, else Debian's
// python3-torch's /usr/bin/python3 or the python3 on PATH), or skips t.
func python(t *testing.T) string {
	p, err := torchcheck.Python()
	if err != nil {
		t.Skip(err)
	}
	return p
}

// TestMLP_MatchesTorch has PyTorch build the MLP, write its state_dict as
// TensorDict(model.state_dict()).memmap_() lays it out, and compute its
// outputs for random inputs (scripts/torch_mlp.py); Go loads the
// state_dict read-only and must compute the same outputs to 1e-5.
func TestMLP_MatchesTorch(t *testing.T) {
	py := python(t)
	// The script is run, not compiled in: the test depends on it (and
	// finds it) through the module's folder, not its source file's path,
	// which -trimpath hides.
	script := filepath.Join(proctest.DependOnModule(t), "scripts", "torch_mlp.py")
	dir := t.TempDir()
	cmd := exec.Command(py, script, dir, "--sizes", "64,256,16", "--rows", "48", "--seed", "11")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	params, err := tensordict.LoadMemmap(filepath.Join(dir, "params"), tensordict.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer params.Close()
	io, err := tensordict.LoadMemmap(filepath.Join(dir, "io"), tensordict.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	got, err := SizesOf(params)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Sizes: got})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Load(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	obs, _ := io.Tensor("obs")
	in, _ := tensordict.New(48)
	in.Set(DefaultIn, obs)
	out, err := m.Forward(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	logits, _ := io.Tensor("logits")
	want, _ := tensordict.Values[float32](logits)
	closeTo(t, "Go against torch", outputs(t, out), want, 1e-5)
}
