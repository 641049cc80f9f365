package tensordict

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadMemmap writes fuzzed bytes as the meta.json of a folder that also
// holds leaf files and a nested folder copied from a fixture, and loads it.
// Whatever the bytes, LoadMemmap must not panic, must return an error or a
// TensorDict, and every tensor it returns must be readable: its file was
// checked to be long enough.
func FuzzLoadMemmap(f *testing.F) {
	for _, name := range goldenCases {
		if b, err := os.ReadFile(filepath.Join("testdata", "golden", name, metaFile)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"obs":{"device":"cpu","shape":[4,3],"dtype":"torch.float32","is_nested":false},"shape":[4],"_type":"<class 'tensordict._td.TensorDict'>"}`))
	f.Add([]byte(`{"obs":{"shape":[99999999999,99999999999],"dtype":"torch.complex128"},"shape":[],"_type":"<class 'tensordict._td.TensorDict'>"}`))
	f.Add([]byte(`{"next":{"type":"TensorDict"},"shape":[4],"_type":"<class 'tensordict._td.TensorDict'>"}`))
	f.Add([]byte(`{"../next":{"type":"TensorDict"},"_type":"<class 'tensordict._td.TensorDict'>"}`))
	// Found by this fuzzer: an empty collection key named the folder itself
	// and the loader recursed until the stack overflowed.
	f.Add([]byte(`{"":{"type":"TensorDict"},"shape":[4],"device":"cpu","_type":"<class 'tensordict._td.TensorDict'>"}`))
	f.Fuzz(func(t *testing.T, meta []byte) {
		dir := t.TempDir()
		src := filepath.Join("testdata", "golden", "basic_orjson")
		if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, metaFile), meta, 0o644); err != nil {
			t.Fatal(err)
		}
		td, err := LoadMemmap(dir, ReadOnly())
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error of no documented kind: %v", err)
			}
			return
		}
		defer td.Close()
		for p, x := range td.Leaves() {
			if x.NumBytes() > 1<<20 {
				t.Fatalf("%v: %d bytes mapped from small fixture files", p, x.NumBytes())
			}
			if _, err := x.Clone(); err != nil {
				t.Fatalf("%v: loaded tensor unreadable: %v", p, err)
			}
		}
	})
}
