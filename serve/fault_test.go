package serve

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/serve/mlp"
)

// TestManager_FaultInForwardIsErrForward serves a model that keeps a view
// of a mapping (as serve.Loader allows), truncates the mapping's file, and
// predicts: the model's SIGBUS fails the batch with ErrForward, and the
// process lives on. It runs in a child process of its own, since before
// the fault killed the process.
func TestManager_FaultInForwardIsErrForward(t *testing.T) {
	if os.Getenv("SERVE_TEST_FAULT_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestManager_FaultInForwardIsErrForward$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "SERVE_TEST_FAULT_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			s := string(out)
			if len(s) > 4000 {
				s = s[:4000]
			}
			t.Fatalf("the test's process: %v\n%s", err, s)
		}
		return
	}
	path := filepath.Join(t.TempDir(), "w.memmap")
	w, err := memmap.Create(path, memmap.Float32, 4096)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	mapped, err := memmap.Open(path, memmap.Float32, []int{4096}, memmap.ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	view, err := mapped.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	var sink byte
	b := &behaviour{forward: func(int) error {
		for i := 0; i < len(view); i += 4096 {
			sink += view[i]
		}
		return nil
	}}
	m := newManager(t, testConfig(b, 4))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := m.Predict(ctx, rowsOf(t, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	_, _, err = m.Predict(ctx, rowsOf(t, 1, 2))
	if !errors.Is(err, ErrForward) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("predict with the model's mapping truncated: %v; want ErrForward saying it faulted", err)
	}
	t.Log(err, sink)
}

// TestManager_NoParamsBeforeLoad serves serve/mlp's MLP, whose weights are
// zero until its first Load: a prediction before any Load is refused with
// ErrNoParams (FailedPrecondition), where it used to answer zeros as
// version 0; after Load it computes with the parameters, as version 1.
func TestManager_NoParamsBeforeLoad(t *testing.T) {
	sizes := []int{4, 8, 2}
	shape, _ := mlp.New(mlp.Config{Sizes: sizes})
	m := newManager(t, Config{
		Input: shape.Input(), Output: shape.Output(), MaxBatch: 4, Replicas: 2,
		New: func(int) (Model, error) { return mlp.New(mlp.Config{Sizes: sizes}) },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	in, _ := shape.Input().Zeros(2)
	x, _ := in.Tensor(mlp.DefaultIn)
	x.Fill([]int{0, 1}, 1)
	out, v, err := m.Predict(ctx, in)
	if !errors.Is(err, ErrNoParams) {
		t.Fatalf("predict before any Load: version %d, outputs %v, err %v; want ErrNoParams", v, out, err)
	}
	if !strings.Contains(err.Error(), "*mlp.MLP") {
		t.Errorf("the error does not name the model: %v", err)
	}
	params := mlp.Random(sizes, 1)
	if _, err := m.Load(ctx, params); err != nil {
		t.Fatal(err)
	}
	want, _ := mlp.New(mlp.Config{Sizes: sizes})
	want.Load(ctx, params)
	wantOut, _ := want.Forward(ctx, in)
	for range 4 {
		out, v, err = m.Predict(ctx, in)
		if err != nil || v != 1 || !out.Equal(wantOut) {
			t.Fatalf("after Load: version %d, err %v, outputs equal to the MLP's: %v", v, err, err == nil && out.Equal(wantOut))
		}
	}
}
