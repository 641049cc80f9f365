// Package docs_test checks the code in the docs against the library: the
// numpy loader of format.md runs on prefixes tensordict writes.
package docs_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// docBlock returns the body of the fenced code block between doc's
// "<!-- begin NAME -->" and "<!-- end NAME -->" lines.
func docBlock(t *testing.T, doc, name string) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- begin "+name+" -->\n")
	block, _, ok2 := strings.Cut(rest, "<!-- end "+name+" -->")
	block = strings.TrimSpace(block)
	if !ok || !ok2 || !strings.HasPrefix(block, "```") || !strings.HasSuffix(block, "```") {
		t.Fatalf("%s has no fenced block between <!-- begin %s --> and <!-- end %s -->", doc, name, name)
	}
	_, body, _ := strings.Cut(block, "\n")
	return strings.TrimSuffix(body, "```")
}

// pythonWithNumpy returns an interpreter that imports numpy (Debian's
// python3-numpy installs it for /usr/bin/python3, which may not be the
// python3 first on PATH), or skips t.
func pythonWithNumpy(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import numpy").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with numpy (apt-get install python3-numpy): format.md's numpy loader not run")
	return ""
}

// driver loads each prefix given as an argument with the doc's
// load_prefix and prints, per prefix, every leaf's path with its numpy
// dtype, shape and bytes in hex, every non-tensor's data, or the error.
const driver = `
import sys


def walk(td, path, out):
    for key, v in td.items():
        p = path + [key]
        if isinstance(v, dict):
            walk(v, p, out)
        elif isinstance(v, NonTensorData):
            out.append({"path": p, "data": v.data})
        else:
            out.append({"path": p, "dtype": v.dtype.str, "shape": list(v.shape), "hex": v.tobytes().hex()})


result = []
for prefix in sys.argv[1:]:
    try:
        out = []
        walk(load_prefix(prefix), [], out)
        result.append({"items": out})
    except Exception as e:
        result.append({"error": "%s: %s" % (type(e).__name__, e)})
print(json.dumps(result))
`

type loaded struct {
	Items []struct {
		Path  []string `json:"path"`
		DType string   `json:"dtype"`
		Shape []int    `json:"shape"`
		Hex   string   `json:"hex"`
		Data  any      `json:"data"`
	} `json:"items"`
	Error string `json:"error"`
}

// numpyDType is the numpy dtype the doc's loader must give each dtype.
var numpyDType = map[memmap.DType]string{
	memmap.Bool: "|b1", memmap.Uint8: "|u1", memmap.Int8: "|i1",
	memmap.Int16: "<i2", memmap.Int32: "<i4", memmap.Int64: "<i8",
	memmap.Uint16: "<u2", memmap.Uint32: "<u4", memmap.Uint64: "<u8",
	memmap.Float16: "<f2", memmap.BFloat16: "<u2",
	memmap.Float32: "<f4", memmap.Float64: "<f8",
	memmap.Complex64: "<c8", memmap.Complex128: "<c16",
}

// TestFormat_NumpyLoader runs format.md's numpy loader on a prefix that
// tensordict.Create wrote (every dtype, keys that need escaping, nested
// TensorDicts, a tensor with no elements), on one with non-tensor data
// (Memmap), and on the golden fixture of pickled data, and compares every
// dtype, shape and byte with what Go wrote.
func TestFormat_NumpyLoader(t *testing.T) {
	py := pythonWithNumpy(t)
	const batch = 5
	type leaf struct {
		key   []string
		dt    memmap.DType
		shape []int
	}
	leaves := []leaf{
		{[]string{"obs"}, memmap.Float32, []int{batch, 3}},
		{[]string{"a/b"}, memmap.Int64, []int{batch}},
		{[]string{"100%"}, memmap.Uint8, []int{batch, 2}},
		{[]string{"x y"}, memmap.Bool, []int{batch}},
		{[]string{"q?*<>|:\"\\"}, memmap.Int16, []int{batch}},
		{[]string{"tab\there\x7f"}, memmap.Int8, []int{batch}},
		{[]string{"café.σ"}, memmap.Int32, []int{batch}},
		{[]string{"empty"}, memmap.Float32, []int{batch, 0}},
		{[]string{"half"}, memmap.Float16, []int{batch, 2}},
		{[]string{"brain"}, memmap.BFloat16, []int{batch}},
		{[]string{"c64"}, memmap.Complex64, []int{batch}},
		{[]string{"c128"}, memmap.Complex128, []int{batch}},
		{[]string{"u16"}, memmap.Uint16, []int{batch}},
		{[]string{"u32"}, memmap.Uint32, []int{batch}},
		{[]string{"u64"}, memmap.Uint64, []int{batch}},
		{[]string{"next", "reward"}, memmap.Float64, []int{batch}},
		{[]string{"next", "sub dir", "v/w"}, memmap.Uint16, []int{batch, 1, 2}},
	}
	dir := t.TempDir()
	prefix := filepath.Join(dir, "td")
	fields := make([]tensordict.Field, len(leaves))
	for i, l := range leaves {
		fields[i] = tensordict.Field{Key: l.key, DType: l.dt, Shape: l.shape}
	}
	td, err := tensordict.Create(prefix, []int{batch}, fields...)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string][]byte{}
	for _, l := range leaves {
		x, err := td.Tensor(l.key...)
		if err != nil {
			t.Fatal(err)
		}
		b, err := x.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		for i := range b {
			b[i] = byte(rng.Uint32())
			if l.dt == memmap.Bool {
				b[i] &= 1
			}
		}
		want[strings.Join(l.key, "\x00")] = bytes.Clone(b)
	}
	if err := td.Close(); err != nil {
		t.Fatal(err)
	}

	// Non-tensor data beside a tensor, written by Memmap.
	ntPrefix := filepath.Join(dir, "nt")
	nt, _ := tensordict.New(2)
	x, _ := tensordict.FromSlice([]float32{1.5, -2}, 2)
	nt.Set("x", x)
	nt.Set("cfg lr", &tensordict.NonTensor{Data: map[string]any{"lr": 0.001, "name": "été"}})
	written, err := nt.Memmap(ntPrefix)
	if err != nil {
		t.Fatal(err)
	}
	written.Close()

	src := docBlock(t, "format.md", "numpy-loader") + driver
	out, err := exec.Command(py, "-c", src, prefix, ntPrefix, "../tensordict/testdata/golden/nontensor").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s: %v\n%s", py, err, stderr)
	}
	var got []loaded
	if err := json.Unmarshal(out, &got); err != nil || len(got) != 3 {
		t.Fatalf("driver output %s: %v", out, err)
	}

	if got[0].Error != "" {
		t.Fatalf("loading %s: %s", prefix, got[0].Error)
	}
	if len(got[0].Items) != len(leaves) {
		t.Errorf("numpy loaded %d leaves, want %d: %+v", len(got[0].Items), len(leaves), got[0].Items)
	}
	for i, it := range got[0].Items {
		if i >= len(leaves) {
			break
		}
		l := leaves[i] // meta.json's order is Create's
		if !reflect.DeepEqual(it.Path, l.key) {
			t.Errorf("leaf %d: path %q, want %q", i, it.Path, l.key)
			continue
		}
		if it.DType != numpyDType[l.dt] || !reflect.DeepEqual(it.Shape, l.shape) {
			t.Errorf("%q: numpy %s %v, want %s %v", l.key, it.DType, it.Shape, numpyDType[l.dt], l.shape)
		}
		b, err := hex.DecodeString(it.Hex)
		if w := want[strings.Join(l.key, "\x00")]; err != nil || !bytes.Equal(b, w) {
			t.Errorf("%q: numpy read % x, Go wrote % x", l.key, b, w)
		}
	}

	if got[1].Error != "" || len(got[1].Items) != 2 {
		t.Fatalf("loading %s: %+v", ntPrefix, got[1])
	}
	if it := got[1].Items[0]; it.DType != "<f4" || it.Hex != hex.EncodeToString([]byte{0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0}) {
		t.Errorf("x: %+v, want float32 1.5, -2", it)
	}
	if it := got[1].Items[1]; !reflect.DeepEqual(it.Path, []string{"cfg lr"}) ||
		!reflect.DeepEqual(it.Data, map[string]any{"lr": 0.001, "name": "été"}) {
		t.Errorf("non-tensor: %+v", it)
	}

	if !strings.Contains(got[2].Error, "other.pickle") {
		t.Errorf("the pickled fixture: %+v, want an error naming other.pickle", got[2])
	}
}
