package serve

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestManager_FollowsAStore publishes parameters in a store while a
// manager follows them: each version is loaded with the store's number,
// one the model refuses is skipped, and the manager keeps only the
// version its models use.
func TestManager_FollowsAStore(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := testConfig(&behaviour{}, 4)
	cfg.Replicas = 2
	m := newManager(t, cfg)
	ctx, cancel := context.WithCancel(ctxT(t))
	followed := make(chan error, 1)
	go func() { followed <- m.Follow(ctx, st, "policy") }()

	// waitFor predicts until the outputs say version v with bias.
	waitFor := func(v uint64, bias float32) {
		t.Helper()
		poll(t, "the new version", func() bool {
			out, got, err := m.Predict(ctxT(t), rowsOf(t, 1, 1))
			if err != nil {
				t.Fatal(err)
			}
			if got != v {
				return false
			}
			if _, err := checkOutputs(out, 1, 1, bias); err != nil {
				t.Fatal(err)
			}
			return true
		})
	}
	publish := func(td *tensordict.TensorDict) uint64 {
		t.Helper()
		v, err := st.Publish(ctxT(t), "policy", td)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v1 := publish(params(t, 100))
	waitFor(v1, 100)
	v2 := publish(params(t, 200))
	waitFor(v2, 200)
	bad, _ := tensordict.New()
	x, _ := tensordict.FromSlice([]float32{1, 2}, 2)
	bad.Set("bias", x) // of the wrong shape
	publish(bad)
	v4 := publish(params(t, 400))
	waitFor(v4, 400)
	m.mu.Lock()
	kept := len(m.kept)
	m.mu.Unlock()
	if kept != 1 {
		t.Errorf("the manager keeps %d versions, want the one its models use", kept)
	}
	cancel()
	if err := <-followed; !errors.Is(err, context.Canceled) {
		t.Errorf("Follow after its context ended: %v", err)
	}
	// The models still run the last version.
	if _, v, err := m.Predict(ctxT(t), rowsOf(t, 1, 1)); err != nil || v != v4 {
		t.Errorf("after Follow ended: version %d, %v", v, err)
	}
}
