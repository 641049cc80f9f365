package tensordict

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

// int32Leaf returns a [2] int32 tensor holding a and b.
func int32Leaf(t testing.TB, a, b int32) *Tensor {
	t.Helper()
	x, err := FromSlice([]int32{a, b}, 2)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// nestedPrefix returns a fresh folder base and a prefix five levels under
// it, deep enough that a key climbing out of the prefix with ".." (a few
// times) still lands inside base, where outsidePrefix sees it.
func nestedPrefix(t testing.TB) (base, prefix string) {
	base = t.TempDir()
	return base, filepath.Join(base, "a", "b", "c", "d", "td")
}

// outsidePrefix lists what exists under base that is neither prefix, what
// lies inside it, nor one of the folders leading to it.
func outsidePrefix(t testing.TB, base, prefix string) []string {
	t.Helper()
	rel, err := filepath.Rel(base, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var stray []string
	err = fs.WalkDir(os.DirFS(base), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inside := p == rel || strings.HasPrefix(p, rel+"/")
		leading := p == "." || strings.HasPrefix(rel, p+"/")
		if !inside && !leading {
			stray = append(stray, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return stray
}

// sameTree reports how got differs from want: keys and their order, batch
// sizes, dtypes, shapes, every byte of every tensor, and non-tensor data as
// JSON.
func sameTree(want, got *TensorDict) error {
	if !slices.Equal(want.Keys(), got.Keys()) {
		return errors.New("keys " + quoteAll(got.Keys()) + ", want " + quoteAll(want.Keys()))
	}
	if !slices.Equal(want.BatchSize(), got.BatchSize()) {
		return errors.New("batch sizes differ")
	}
	for _, k := range want.keys {
		wv, gv := want.vals[k], got.vals[k]
		if kindOf(wv) != kindOf(gv) {
			return errors.New(quoteAll([]string{k}) + " is a " + kindOf(gv) + ", want a " + kindOf(wv))
		}
		switch w := wv.(type) {
		case *TensorDict:
			if err := sameTree(w, gv.(*TensorDict)); err != nil {
				return errors.New(quoteAll([]string{k}) + ": " + err.Error())
			}
		case *Tensor:
			g := gv.(*Tensor)
			wb, werr := w.Bytes()
			gb, gerr := g.Bytes()
			if werr != nil || gerr != nil || w.DType() != g.DType() || !slices.Equal(w.Shape(), g.Shape()) || !bytes.Equal(wb, gb) {
				return errors.New(quoteAll([]string{k}) + ": tensor differs")
			}
		case *NonTensor:
			wj, _ := json.Marshal(w.Data)
			gj, _ := json.Marshal(gv.(*NonTensor).Data)
			if !bytes.Equal(wj, gj) {
				return errors.New(quoteAll([]string{k}) + ": data " + string(gj) + ", want " + string(wj))
			}
		}
	}
	return nil
}

func quoteAll(keys []string) string {
	b, _ := json.Marshal(keys)
	return string(b)
}

// TestMemmap_KeysStayInsidePrefix writes keys that are not names of their
// own ("", ".", ".."), as leaves, nested TensorDicts and non-tensors: every
// file must land inside the prefix, under tensordict 0.14's names, and load
// back as written.
func TestMemmap_KeysStayInsidePrefix(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(t *testing.T) *TensorDict
		files []string // some of the files that must exist, relative to the prefix
	}{
		{"leaves", func(t *testing.T) *TensorDict {
			td := mustNew(t, 2)
			td.Set("", int32Leaf(t, 1, 2))
			td.Set(".", int32Leaf(t, 3, 4))
			td.Set("..", int32Leaf(t, 5, 6))
			return td
		}, []string{"%.memmap", "%2E.memmap", "%2E%2E.memmap"}},
		{"nested", func(t *testing.T) *TensorDict {
			td := mustNew(t, 2)
			td.SetPath([]string{"", "x"}, int32Leaf(t, 1, 2))
			td.SetPath([]string{".", "."}, int32Leaf(t, 3, 4))
			td.SetPath([]string{"..", "..", ".."}, int32Leaf(t, 5, 6))
			td.SetPath([]string{"..", ""}, &NonTensor{Data: "up"})
			return td
		}, []string{"%/x.memmap", "%2E/%2E.memmap", "%2E%2E/%2E%2E/%2E%2E.memmap", "%2E%2E/%/meta.json"}},
		{"non-tensors", func(t *testing.T) *TensorDict {
			td := mustNew(t, 2)
			td.Set("", &NonTensor{Data: 1})
			td.Set(".", &NonTensor{Data: 2})
			td.Set("..", &NonTensor{Data: 3})
			return td
		}, []string{"%/meta.json", "%2E/meta.json", "%2E%2E/meta.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, prefix := nestedPrefix(t)
			td := tc.build(t)
			out, err := td.Memmap(prefix)
			if err != nil {
				t.Fatal(err)
			}
			out.Close()
			if stray := outsidePrefix(t, base, prefix); len(stray) > 0 {
				t.Errorf("written outside the prefix: %q", stray)
			}
			for _, f := range tc.files {
				if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
					t.Errorf("tensordict 0.14's name: %v", err)
				}
			}
			back, err := LoadMemmap(prefix, ReadOnly())
			if err != nil {
				t.Fatal(err)
			}
			defer back.Close()
			if err := sameTree(td, back); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestMemmap_RefusesNameClashes checks keys of one TensorDict whose files or
// folders would have the same name: the write is refused with ErrKey before
// anything is touched, so the dataset already at the prefix still loads.
func TestMemmap_RefusesNameClashes(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys func(t *testing.T, td *TensorDict)
	}{
		{"folder named like a leaf file", func(t *testing.T, td *TensorDict) {
			td.Set("a", int32Leaf(t, 1, 2))
			td.Set("a.memmap", mustNew(t, 2))
		}},
		{"non-tensor named like a leaf file", func(t *testing.T, td *TensorDict) {
			td.Set("a.memmap", &NonTensor{Data: 1})
			td.Set("a", int32Leaf(t, 1, 2))
		}},
		{"folder named meta.json", func(t *testing.T, td *TensorDict) {
			td.Set("meta.json", mustNew(t, 2))
		}},
		{"deeper down", func(t *testing.T, td *TensorDict) {
			td.SetPath([]string{"n", "b"}, int32Leaf(t, 1, 2))
			td.SetPath([]string{"n", "b.memmap"}, &NonTensor{Data: 1})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "p")
			old := mustNew(t, 2)
			old.Set("x", int32Leaf(t, 7, 8))
			m, err := old.Memmap(prefix)
			if err != nil {
				t.Fatal(err)
			}
			m.Close()
			before := snapshot(t, prefix)

			td := mustNew(t, 2)
			td.Set("first", int32Leaf(t, 0, 0)) // would be written before the clash
			tc.keys(t, td)
			if _, err := td.Memmap(prefix); !errors.Is(err, ErrKey) {
				t.Fatalf("err = %v, want ErrKey", err)
			}
			if after := snapshot(t, prefix); !maps.Equal(before, after) {
				t.Errorf("a refused write changed the prefix: %q, was %q", keysOf(after), keysOf(before))
			}
			back, err := LoadMemmap(prefix)
			if err != nil {
				t.Fatalf("the old dataset no longer loads: %v", err)
			}
			back.Close()
		})
	}

	// A tensor without elements has no file, so nothing clashes with it.
	td := mustNew(t, 2)
	e, _ := Zeros(memmap.Int32, 2, 0)
	td.Set("a", e)
	td.Set("a.memmap", mustNew(t, 2))
	m, err := td.Memmap(filepath.Join(t.TempDir(), "p"))
	if err != nil {
		t.Fatalf("an empty tensor next to a folder of its file's name: %v", err)
	}
	m.Close()
}

// TestMemmap_KeyNearTheNameLimit writes a key whose file name is 247
// bytes (k...k.memmap), within Linux's 255, as tensordict writes and
// LoadMemmap reads it, with Memmap and MemmapLike, and loads it back.
// Before the fix both failed with ENAMETOOLONG: memmap.Create built the
// file under "."+name+".tmp-" and up to 10 digits, over the limit.
func TestMemmap_KeyNearTheNameLimit(t *testing.T) {
	key := strings.Repeat("k", 240)
	src := mustNew(t, 2)
	noErr(t, src.Set(key, int32Leaf(t, 1, 2)))
	for name, write := range map[string]func(string, ...WriteOption) (*TensorDict, error){"Memmap": src.Memmap, "MemmapLike": src.MemmapLike} {
		prefix := filepath.Join(t.TempDir(), "p")
		out, err := write(prefix)
		if err != nil {
			t.Errorf("%s of a key whose file name is %d bytes: %v", name, len(key)+len(leafSuffix), err)
			continue
		}
		out.Close()
		back, err := LoadMemmap(prefix, ReadOnly())
		if err != nil {
			t.Errorf("LoadMemmap after %s: %v", name, err)
			continue
		}
		if !back.Has(key) {
			t.Errorf("LoadMemmap after %s: keys %v", name, back.Keys())
		}
		back.Close()
	}
}

// TestLegacyName_StaysInFolder checks which raw keys LoadMemmap tries as
// names that older tensordict wrote (legacyNameOn), on Windows and
// elsewhere: only single path components. On Windows "\" is a separator
// and ":" a drive ("C:x" is relative to C:'s current folder) or a stream,
// so those keys are not tried there; elsewhere they are ordinary names.
// Before the fix the check ignored the system, and on Windows a key such
// as `..\..\x` or `C:x` led out of the prefix.
func TestLegacyName_StaysInFolder(t *testing.T) {
	for _, tc := range []struct {
		key, suffix string
		windows     bool
		want        string // "" if none is tried
	}{
		{"x y", leafSuffix, true, "x y.memmap"},
		{"x y", "", false, "x y"},
		{"a/b", leafSuffix, false, ""},
		{"a\x00b", "", false, ""},
		{"", "", false, ""},
		{".", "", true, ""},
		{"..", "", false, ""},
		{".", leafSuffix, false, "..memmap"},
		{`..\..\x`, leafSuffix, false, `..\..\x.memmap`},
		{`..\..\x`, leafSuffix, true, ""},
		{`..\sub`, "", true, ""},
		{"C:x", leafSuffix, false, "C:x.memmap"},
		{"C:x", leafSuffix, true, ""},
		{`C:\x`, "", true, ""},
		{"a:stream", "", true, ""},
	} {
		got, ok := legacyNameOn(tc.windows, tc.key, tc.suffix)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("legacyNameOn(windows=%v, %q, %q) = %q, %v; want %q", tc.windows, tc.key, tc.suffix, got, ok, tc.want)
		}
	}
}

// snapshot maps each file under dir to its content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := fs.WalkDir(os.DirFS(dir), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(filepath.Join(dir, p))
		m[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func keysOf(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// TestMemmap_MetaJSONWritesLineSeparatorsRaw checks U+2028 and U+2029 in
// keys and non-tensor data: orjson (and Python's json with
// ensure_ascii=False) write them as they are, encoding/json as \u2028; a
// backslash followed by "u2028" in a key stays escaped.
func TestMemmap_MetaJSONWritesLineSeparatorsRaw(t *testing.T) {
	td := mustNew(t, 2)
	td.Set("a\u2028b", int32Leaf(t, 1, 2))
	td.Set(`c\u2029`, int32Leaf(t, 3, 4))
	td.Set("info", &NonTensor{Data: map[string]any{"s": "x\u2029y"}})
	prefix := filepath.Join(t.TempDir(), "p")
	m, err := td.Memmap(prefix)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	meta, _ := os.ReadFile(filepath.Join(prefix, metaFile))
	if !bytes.HasPrefix(meta, []byte("{\"a\u2028b\":{")) || !bytes.Contains(meta, []byte(`"c\\u2029":{`)) {
		t.Errorf("meta.json: %s", meta)
	}
	info, _ := os.ReadFile(filepath.Join(prefix, "info", metaFile))
	if want := "\"data\":{\"s\":\"x\u2029y\"}"; !bytes.Contains(info, []byte(want)) {
		t.Errorf("info/meta.json %s does not contain %s", info, want)
	}
	back, err := LoadMemmap(prefix, ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if err := sameTree(td, back); err != nil {
		t.Error(err)
	}
}
