package tensordict

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
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

// FuzzMemmapKeys builds a TensorDict from four fuzzed keys, as leaves,
// non-tensors and nested TensorDicts (two bits of kinds per key), writes it
// with Memmap into a fresh folder a few levels down, and checks that nothing
// was created outside that folder, whatever the keys, and that LoadMemmap
// gives back the same keys, values and order. Memmap may refuse the keys
// (ErrKey) or the file system may (a name too long), but must not write
// anything outside the prefix either way.
func FuzzMemmapKeys(f *testing.F) {
	// More seeds in testdata/fuzz/FuzzMemmapKeys: the keys "", "." and ".."
	// that tensorwire once wrote outside the prefix, and name clashes.
	f.Add("obs", "next", "reward", "info", uint8(0b01_00_10_00))
	f.Add("a/b", "%", "%2E", ".x", uint8(0b11_10_01_00))
	f.Fuzz(func(t *testing.T, k1, k2, k3, k4 string, kinds uint8) {
		td := mustNew(t, 2)
		cur := td
		for i, k := range []string{k1, k2, k3, k4} {
			var err error
			switch kinds >> (2 * i) & 3 {
			case 0:
				err = cur.Set(k, int32Leaf(t, int32(i), int32(-i)))
			case 1:
				err = cur.Set(k, &NonTensor{Data: map[string]any{"i": i, "k": k}})
			case 2: // the next keys go in here
				sub := mustNew(t, 2)
				if err = cur.Set(k, sub); err == nil {
					cur = sub
				}
			case 3:
				sub := mustNew(t, 2)
				sub.Set(k, int32Leaf(t, int32(i), 7))
				err = cur.Set(k, sub)
			}
			if err != nil {
				t.Fatalf("Set(%q): %v", k, err)
			}
		}
		base, prefix := nestedPrefix(t)
		out, err := td.Memmap(prefix)
		if stray := outsidePrefix(t, base, prefix); len(stray) > 0 {
			t.Fatalf("written outside the prefix: %q (Memmap: %v)", stray, err)
		}
		if err != nil {
			if !errors.Is(err, ErrKey) && !errors.Is(err, syscall.ENAMETOOLONG) {
				t.Fatalf("Memmap: error of no documented kind: %v", err)
			}
			return
		}
		out.Close()
		back, err := LoadMemmap(prefix, ReadOnly())
		if err != nil {
			t.Fatalf("LoadMemmap of what Memmap wrote: %v", err)
		}
		defer back.Close()
		if err := sameTree(td, back); err != nil {
			t.Fatal(err)
		}
	})
}
