package tensordict

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
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
