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
