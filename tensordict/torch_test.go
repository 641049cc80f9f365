package tensordict

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/torchcheck"
)

// TestTorch_LoadsWhatMemmapWrites writes TensorDicts with Memmap and has
// real PyTorch load them the way tensordict's load_memmap does: every
// element must be what Go wrote, and every dtype name one torch knows.
func TestTorch_LoadsWhatMemmapWrites(t *testing.T) {
	if err := torchcheck.Available(); err != nil {
		t.Skip(err)
	}
	// Every case's folder is written first, then read by one Python
	// process (an import of torch costs seconds).
	names := []string{"dtypes", "escaped_keys", "basic_orjson", "empty_leaf", "special_keys"}
	prefixes := make([]string, len(names))
	tds := make([]*TensorDict, len(names))
	for i, name := range names {
		prefixes[i] = filepath.Join(t.TempDir(), "out")
		td, err := build(t, readExpected(t, name)).Memmap(prefixes[i])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		td.Close() // torch reads what a closed TensorDict left
		tds[i] = td
	}
	loaded, err := torchcheck.LoadAll(prefixes, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			e, td, got := readExpected(t, name), tds[i], loaded[i]
			if !slices.Equal(got.BatchSize, e.TensorDicts[0].BatchSize) {
				t.Errorf("torch batch size %v, want %v", got.BatchSize, e.TensorDicts[0].BatchSize)
			}
			for _, l := range e.Leaves {
				key := strings.Join(l.Path, "/")
				f, ok := got.Fields[key]
				if !ok {
					if why, skipped := got.Skipped[key]; skipped && strings.HasPrefix(l.DType, "torch.uint") && l.DType != "torch.uint8" {
						t.Logf("%s: %s (torch < 2.3)", key, why)
						continue
					}
					t.Errorf("%s: torch did not load it (skipped: %q)", key, got.Skipped[key])
					continue
				}
				x, _ := td.Tensor(l.Path...)
				if f.DType != l.DType || !slices.Equal(f.Shape, l.Shape) {
					t.Errorf("%s: torch sees %s %v, want %s %v", key, f.DType, f.Shape, l.DType, l.Shape)
					continue
				}
				want := encodeValues(t, x.DType(), l.Values)
				if gotBytes := encodeValues(t, x.DType(), f.Values); !bytes.Equal(gotBytes, want) {
					t.Errorf("%s: torch reads %v, Go wrote %v", key, gotBytes, want)
				}
			}
		})
	}
}
