package importer

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/npy"
	"github.com/tensorwire/tensorwire/internal/testkit/torchcheck"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// writeIDX writes an IDX file of uint8 data with the given dims, gzipped
// when gz is set.
func writeIDX(t *testing.T, path string, dims []int, data []byte, gz bool) {
	t.Helper()
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(data)
	out := b.Bytes()
	if gz {
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(out)
		w.Close()
		out = z.Bytes()
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// idxPair writes n images of 2x3 (image i filled with byte base+i) and
// labels base+i, and returns the pair.
func idxPair(t *testing.T, dir, name string, n, base int, gz bool) Pair {
	t.Helper()
	img := make([]byte, n*6)
	lbl := make([]byte, n)
	for i := range n {
		for j := range 6 {
			img[i*6+j] = byte(base + i)
		}
		lbl[i] = byte(base + i)
	}
	p := Pair{filepath.Join(dir, name+"-images"), filepath.Join(dir, name+"-labels")}
	writeIDX(t, p.Images, []int{n, 2, 3}, img, gz)
	writeIDX(t, p.Labels, []int{n}, lbl, gz)
	return p
}

func load(t *testing.T, prefix string) *tensordict.TensorDict {
	t.Helper()
	td, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { td.Close() })
	return td
}

func TestIDX_ConcatenatesPairs(t *testing.T) {
	dir := t.TempDir()
	pairs := []Pair{idxPair(t, dir, "a", 3, 10, true), idxPair(t, dir, "b", 2, 50, false)}
	prefix := filepath.Join(dir, "ds")
	var progress bytes.Buffer
	n, err := IDX(context.Background(), prefix, pairs, Options{Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Errorf("n = %d, want 5", n)
	}
	td := load(t, prefix)
	images, _ := td.Tensor("images")
	if images.DType() != memmap.Uint8 || !slices.Equal(images.Shape(), []int{5, 2, 3}) {
		t.Fatalf("images %v %v", images.DType(), images.Shape())
	}
	row, _ := images.Gather([]int{3})
	if v, _ := tensordict.Values[uint8](row); !slices.Equal(v, []uint8{50, 50, 50, 50, 50, 50}) {
		t.Errorf("row 3 (first of the second pair) = %v", v)
	}
	labels, _ := td.Tensor("labels")
	if v, _ := tensordict.Values[int64](labels); !slices.Equal(v, []int64{10, 11, 12, 50, 51}) {
		t.Errorf("labels %v", v)
	}
	if !bytes.Contains(progress.Bytes(), []byte("100%")) {
		t.Errorf("no final progress line in %q", progress.String())
	}
}

func TestIDX_BadInputLeavesNoPrefix(t *testing.T) {
	dir := t.TempDir()
	good := idxPair(t, dir, "good", 4, 0, false)
	short := idxPair(t, dir, "short", 4, 0, false)
	raw, _ := os.ReadFile(short.Images)
	os.WriteFile(short.Images, raw[:len(raw)-5], 0o644)
	mismatch := idxPair(t, dir, "mismatch", 4, 0, false)
	mismatch.Labels = idxPair(t, dir, "three", 3, 0, false).Labels
	// Damage that only shows after the last data byte: the import must read
	// each file to its end.
	trailing := idxPair(t, dir, "trailing", 4, 0, false)
	raw, _ = os.ReadFile(trailing.Images)
	os.WriteFile(trailing.Images, append(raw, 0), 0o644)
	badSum := idxPair(t, dir, "badsum", 4, 0, true)
	raw, _ = os.ReadFile(badSum.Labels)
	raw[len(raw)-8] ^= 1 // CRC-32 in the gzip trailer
	os.WriteFile(badSum.Labels, raw, 0o644)

	for _, tc := range []struct {
		name  string
		pairs []Pair
		want  error
	}{
		{"truncated images", []Pair{good, short}, ErrFormat},
		{"trailing bytes after the images", []Pair{trailing}, ErrFormat},
		{"bad gzip checksum of the labels", []Pair{good, badSum}, ErrFormat},
		{"label count", []Pair{mismatch}, ErrInvalid},
		{"labels as images", []Pair{{good.Labels, good.Labels}}, ErrUnsupported},
		{"missing file", []Pair{{filepath.Join(dir, "nope"), good.Labels}}, fs.ErrNotExist},
		{"no pairs", nil, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "ds")
			if _, err := IDX(context.Background(), prefix, tc.pairs, Options{}); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			assertNoDataset(t, prefix)
		})
	}
}

func assertNoDataset(t *testing.T, prefix string) {
	t.Helper()
	if _, err := os.Stat(prefix); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed import left %s behind (%v)", prefix, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(prefix))
	for _, e := range entries {
		t.Errorf("a failed import left %s behind", e.Name())
	}
}

func TestIDX_ExistingPrefixAndCancel(t *testing.T) {
	dir := t.TempDir()
	p := idxPair(t, dir, "a", 2, 0, false)
	prefix := filepath.Join(dir, "out", "ds")
	if _, err := IDX(context.Background(), prefix, []Pair{p}, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := IDX(context.Background(), prefix, []Pair{p}, Options{}); !errors.Is(err, ErrExists) {
		t.Errorf("second import: err = %v, want ErrExists", err)
	}
	q := idxPair(t, dir, "b", 3, 7, false)
	if _, err := IDX(context.Background(), prefix, []Pair{q}, Options{Force: true}); err != nil {
		t.Fatalf("--force: %v", err)
	}
	if got := load(t, prefix).BatchSize(); !slices.Equal(got, []int{3}) {
		t.Errorf("after --force batch %v, want [3]", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	other := filepath.Join(t.TempDir(), "ds")
	if _, err := IDX(ctx, other, []Pair{q}, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled import: err = %v, want context.Canceled", err)
	}
	assertNoDataset(t, other)
}

func TestIDX_FashionMNIST(t *testing.T) {
	const dir = "/usr/share/datasets/fashion-mnist"
	p := Pair{filepath.Join(dir, "t10k-images-idx3-ubyte.gz"), filepath.Join(dir, "t10k-labels-idx1-ubyte.gz")}
	if _, err := os.Stat(p.Images); err != nil {
		t.Skipf("Debian package dataset-fashion-mnist is not installed (.ci/run installs it): %v", err)
	}
	prefix := filepath.Join(t.TempDir(), "fmnist")
	n, err := IDX(context.Background(), prefix, []Pair{p}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	td := load(t, prefix)
	images, _ := td.Tensor("images")
	labels, _ := td.Tensor("labels")
	if n != 10000 || !slices.Equal(images.Shape(), []int{10000, 28, 28}) {
		t.Fatalf("n=%d images %v", n, images.Shape())
	}
	s, err := labels.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// The test set has 1000 images of each of the 10 classes 0..9.
	if s.Min != 0 || s.Max != 9 || s.Sum != 1000*45 {
		t.Errorf("label stats %+v, want min 0 max 9 sum 45000", s)
	}
	if info, _ := os.Stat(filepath.Join(prefix, "images.memmap")); info.Size() != 10000*28*28 {
		t.Errorf("images.memmap is %d bytes", info.Size())
	}
}

func writeNPY(t *testing.T, path string, h npy.Header, data []byte) {
	t.Helper()
	var b bytes.Buffer
	if err := npy.WriteHeader(&b, h); err != nil {
		t.Fatal(err)
	}
	b.Write(data)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestNPY_Import(t *testing.T) {
	dir := t.TempDir()
	obs := make([]byte, 4*3*4)
	for i := range 12 {
		binary.LittleEndian.PutUint32(obs[4*i:], uint32(i))
	}
	writeNPY(t, filepath.Join(dir, "obs.npy"), npy.Header{DType: memmap.Int32, Shape: []int{4, 3}}, obs)
	writeNPY(t, filepath.Join(dir, "done.npy"), npy.Header{DType: memmap.Bool, Shape: []int{4}}, []byte{0, 1, 0, 1})
	writeNPY(t, filepath.Join(dir, "five.npy"), npy.Header{DType: memmap.Bool, Shape: []int{5}}, []byte{0, 1, 0, 1, 1})

	files := []File{
		{Key: []string{"obs"}, Path: filepath.Join(dir, "obs.npy")},
		{Key: []string{"next", "done"}, Path: filepath.Join(dir, "done.npy")},
	}
	prefix := filepath.Join(dir, "ds")
	if _, err := NPY(context.Background(), prefix, files, Options{}); err != nil {
		t.Fatal(err)
	}
	td := load(t, prefix)
	x, _ := td.Tensor("obs")
	if v, _ := tensordict.Values[int32](x); v[11] != 11 || len(v) != 12 {
		t.Errorf("obs %v", v)
	}
	d, err := td.Tensor("next", "done")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := tensordict.Values[bool](d); !slices.Equal(v, []bool{false, true, false, true}) {
		t.Errorf("next/done %v", v)
	}
	bad := append(files, File{Key: []string{"five"}, Path: filepath.Join(dir, "five.npy")})
	if _, err := NPY(context.Background(), filepath.Join(t.TempDir(), "ds"), bad, Options{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("arrays of 4 and 5 rows: err = %v, want ErrInvalid", err)
	}
}

// TestIDX_FashionMNISTLoadsInTorch imports the real Fashion-MNIST training
// and test sets and has PyTorch load the result as tensordict's load_memmap
// would: dtypes, shapes and the sums of every image byte and label must be
// what Go reads.
func TestIDX_FashionMNISTLoadsInTorch(t *testing.T) {
	const dir = "/usr/share/datasets/fashion-mnist"
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Skipf("Debian package dataset-fashion-mnist is not installed (.ci/run installs it): %v", err)
	}
	if err := torchcheck.Available(); err != nil {
		t.Skip(err)
	}
	var pairs []Pair
	for _, set := range []string{"train", "t10k"} {
		pairs = append(pairs, Pair{filepath.Join(dir, set+"-images-idx3-ubyte.gz"), filepath.Join(dir, set+"-labels-idx1-ubyte.gz")})
	}
	prefix := filepath.Join(t.TempDir(), "fmnist")
	if _, err := IDX(context.Background(), prefix, pairs, Options{}); err != nil {
		t.Fatal(err)
	}
	got, err := torchcheck.Load(prefix, false)
	if err != nil {
		t.Fatal(err)
	}
	td := load(t, prefix)
	if !slices.Equal(got.BatchSize, []int{70000}) {
		t.Errorf("torch batch size %v", got.BatchSize)
	}
	for _, key := range []string{"images", "labels"} {
		x, _ := td.Tensor(key)
		s, err := x.Stats()
		if err != nil {
			t.Fatal(err)
		}
		f := got.Fields[key]
		var sum float64
		json.Unmarshal(f.Sum, &sum)
		if f.DType != x.DType().String() || !slices.Equal(f.Shape, x.Shape()) || sum != s.Sum {
			t.Errorf("%s: torch reads %s %v sum %v; Go %v %v sum %v", key, f.DType, f.Shape, sum, x.DType(), x.Shape(), s.Sum)
		}
	}
}

func TestNPY_KeyGivenTwice(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.npy"), filepath.Join(dir, "b.npy")
	writeNPY(t, a, npy.Header{DType: memmap.Bool, Shape: []int{2}}, []byte{0, 1})
	writeNPY(t, b, npy.Header{DType: memmap.Bool, Shape: []int{2}}, []byte{1, 0})
	for _, tc := range []struct {
		name  string
		files []File
		want  string
	}{
		{"twice", []File{{[]string{"obs"}, a}, {[]string{"obs"}, b}}, `key "obs" is given twice`},
		{"tensor, then folder", []File{{[]string{"obs"}, a}, {[]string{"obs", "x"}, b}}, `key "obs" is given both`},
		{"folder, then tensor", []File{{[]string{"n", "obs", "x"}, a}, {[]string{"n", "obs"}, b}}, `key "n/obs" is given both`},
		{"empty key", []File{{nil, a}}, "empty key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "ds")
			_, err := NPY(context.Background(), prefix, tc.files, Options{})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v; want ErrInvalid saying %s", err, tc.want)
			}
			assertNoDataset(t, prefix)
		})
	}
}
