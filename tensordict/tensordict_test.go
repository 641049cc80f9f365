package tensordict

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"gorgonia.org/tensor"
)

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// sample returns a TensorDict of batch [n]: "obs" float32 [n, 2] holding
// 0..2n-1, "action" int64 [n] holding 10*i, and "next"/"done" bool [n].
func sample(t *testing.T, n int) *TensorDict {
	t.Helper()
	obs := make([]float32, 2*n)
	for i := range obs {
		obs[i] = float32(i)
	}
	act := make([]int64, n)
	done := make([]bool, n)
	for i := range act {
		act[i] = int64(10 * i)
		done[i] = i%2 == 1
	}
	td := mustNew(t, n)
	for _, kv := range []struct {
		path []string
		v    Value
	}{
		{[]string{"obs"}, must[*Tensor](t)(FromSlice(obs, n, 2))},
		{[]string{"action"}, must[*Tensor](t)(FromSlice(act))},
		{[]string{"next", "done"}, must[*Tensor](t)(FromSlice(done))},
		{[]string{"info"}, &NonTensor{Data: "episode-1"}},
	} {
		if err := td.SetPath(kv.path, kv.v); err != nil {
			t.Fatal(err)
		}
	}
	return td
}

func values[E Element](t *testing.T, td *TensorDict, path ...string) []E {
	t.Helper()
	x, err := td.Tensor(path...)
	if err != nil {
		t.Fatal(err)
	}
	v, err := Values[E](x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTensorDict_SetAndGet(t *testing.T) {
	td := sample(t, 4)
	if got := td.Keys(); !slices.Equal(got, []string{"obs", "action", "next", "info"}) {
		t.Errorf("keys %q", got)
	}
	for key, want := range map[string]bool{"obs": true, "next": true, "nope": false, "next/obs": false} {
		if td.Has(key) != want {
			t.Errorf("Has(%q) = %v, want %v", key, !want, want)
		}
	}
	bad := must[*Tensor](t)(Zeros(memmap.Uint8, 5, 2))
	if err := td.Set("bad", bad); !errors.Is(err, ErrBatchSize) {
		t.Errorf("Set of a [5 2] tensor in batch [4]: err = %v, want ErrBatchSize", err)
	}
	if err := td.Set("cfg", &NonTensor{Data: func() {}}); !errors.Is(err, ErrKey) {
		t.Errorf("Set of a non-JSON non-tensor: err = %v, want ErrKey", err)
	}
	if _, err := td.Tensor("next", "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing key: err = %v, want ErrNotFound", err)
	}
	if _, err := td.Tensor("obs", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("key below a tensor: err = %v, want ErrNotFound", err)
	}
	if _, err := td.Dict("obs"); !errors.Is(err, ErrKey) {
		t.Errorf("tensor read as a TensorDict: err = %v, want ErrKey", err)
	}
	if err := td.SetPath([]string{"obs", "x"}, bad); !errors.Is(err, ErrKey) {
		t.Errorf("SetPath through a tensor: err = %v, want ErrKey", err)
	}
	// Replacing keeps the position.
	if err := td.Set("obs", must[*Tensor](t)(Zeros(memmap.Float32, 4))); err != nil {
		t.Fatal(err)
	}
	if err := td.Delete("action"); err != nil {
		t.Fatal(err)
	}
	if got := td.Keys(); !slices.Equal(got, []string{"obs", "next", "info"}) {
		t.Errorf("keys after replace and delete %q", got)
	}
	if err := td.Delete("action"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: err = %v, want ErrNotFound", err)
	}
	if _, err := New(2, -1); !errors.Is(err, memmap.ErrShape) {
		t.Errorf("New(2, -1): err = %v, want ErrShape", err)
	}
	var paths []string
	for p := range td.Leaves() {
		paths = append(paths, keyString(p))
	}
	if !slices.Equal(paths, []string{"obs", "next/done"}) {
		t.Errorf("leaves %q", paths)
	}
}

func TestTensorDict_Indexing(t *testing.T) {
	for _, mapped := range []bool{false, true} {
		name := map[bool]string{false: "memory", true: "mapped"}[mapped]
		t.Run(name, func(t *testing.T) {
			td := sample(t, 5)
			if mapped {
				td = must[*TensorDict](t)(td.Memmap(filepath.Join(t.TempDir(), "p")))
				defer td.Close()
			}
			row := must[*TensorDict](t)(td.Index(3))
			if got := row.BatchSize(); len(got) != 0 {
				t.Errorf("row batch size %v, want []", got)
			}
			if got := values[float32](t, row, "obs"); !slices.Equal(got, []float32{6, 7}) {
				t.Errorf("row 3 obs %v", got)
			}
			// Views share storage: writing through them changes td.
			sl := must[*TensorDict](t)(td.Slice(1, 3))
			if err := sl.Fill([]int{1}, -1); err != nil {
				t.Fatal(err)
			}
			if got := values[int64](t, td, "action"); !slices.Equal(got, []int64{0, 10, -1, 30, 40}) {
				t.Errorf("action after filling row 1 of [1:3] = %v", got)
			}
			// Copies do not.
			g := must[*TensorDict](t)(td.Gather([]int{4, 0, 4}))
			if got := values[int64](t, g, "action"); !slices.Equal(got, []int64{40, 0, 40}) {
				t.Errorf("gathered action %v", got)
			}
			if got := values[bool](t, g, "next", "done"); !slices.Equal(got, []bool{false, false, false}) {
				t.Errorf("gathered next/done %v", got)
			}
			g.Fill([]int{0}, 99)
			if got := values[int64](t, td, "action")[4]; got != 40 {
				t.Errorf("filling a gathered copy changed the source: %d", got)
			}
			m := must[*TensorDict](t)(td.Mask([]bool{true, false, false, true, false}))
			if got := values[float32](t, m, "obs"); !slices.Equal(got, []float32{0, 1, 6, 7}) {
				t.Errorf("masked obs %v", got)
			}
			if nt := must[*NonTensor](t)(m.NonTensor("info")); nt.Data != "episode-1" {
				t.Errorf("non-tensor through Mask: %v", nt.Data)
			}
			for _, bad := range []func() error{
				func() error { _, err := td.Index(5); return err },
				func() error { _, err := td.Index(-1); return err },
				func() error { _, err := td.Slice(3, 6); return err },
				func() error { _, err := td.Gather([]int{0, 5}); return err },
			} {
				if err := bad(); !errors.Is(err, memmap.ErrIndex) {
					t.Errorf("out of range: err = %v, want ErrIndex", err)
				}
			}
			if _, err := td.Mask([]bool{true}); !errors.Is(err, ErrBatchSize) {
				t.Errorf("short mask: err = %v, want ErrBatchSize", err)
			}
		})
	}
}

func TestTensorDict_SetRows(t *testing.T) {
	td := sample(t, 6)
	src := must[*TensorDict](t)(td.Gather([]int{0, 1}))
	src.Fill([]int{0, 1}, 7)
	if err := td.SetRows([]int{5, 2}, src); err != nil {
		t.Fatal(err)
	}
	if got := values[int64](t, td, "action"); !slices.Equal(got, []int64{0, 10, 7, 30, 40, 7}) {
		t.Errorf("action after SetRows %v", got)
	}
	if err := td.SetSlice(3, src); err != nil {
		t.Fatal(err)
	}
	if got := values[float32](t, td, "obs")[6:10]; !slices.Equal(got, []float32{7, 7, 7, 7}) {
		t.Errorf("obs rows 3-4 after SetSlice %v", got)
	}
	before := must[*TensorDict](t)(td.Clone())

	wrongDType := must[*TensorDict](t)(src.Clone())
	wrongDType.Delete("action")
	wrongDType.Set("action", must[*Tensor](t)(Zeros(memmap.Int32, 2)))
	extraKey := must[*TensorDict](t)(src.Clone())
	extraKey.Set("new", must[*Tensor](t)(Zeros(memmap.Int32, 2)))
	wrongRow := must[*TensorDict](t)(src.Clone())
	wrongRow.Set("obs", must[*Tensor](t)(Zeros(memmap.Float32, 2, 3)))
	for _, tc := range []struct {
		name string
		rows []int
		src  *TensorDict
		want error
	}{
		{"index out of range", []int{0, 6}, src, memmap.ErrIndex},
		{"row count", []int{0}, src, ErrBatchSize},
		{"dtype", []int{0, 1}, wrongDType, memmap.ErrDType},
		{"key missing in the destination", []int{0, 1}, extraKey, ErrNotFound},
		{"row shape", []int{0, 1}, wrongRow, memmap.ErrShape},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := td.SetRows(tc.rows, tc.src); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !td.Equal(before) {
				t.Error("a refused SetRows changed the TensorDict")
			}
		})
	}
	if err := td.SetSlice(5, src); !errors.Is(err, memmap.ErrIndex) {
		t.Errorf("SetSlice past the end: err = %v, want ErrIndex", err)
	}
}

// TestTensor_SetSliceHugeStartWritesNothing gives SetSlice a start near
// math.MaxInt, on a view of rows [5, 10) of a mapped tensor and on a
// tensor in Go memory: an error wrapping memmap.ErrIndex, and no row of
// the file or slice written. Before the fix the bounds check's
// start+src.Len() overflowed and passed: the mapped view wrote the row
// before it in the file (start*RowBytes wrapped to -8), the Go-memory
// tensor panicked.
func TestTensor_SetSliceHugeStartWritesNothing(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "p")
	td := must[*TensorDict](t)(Create(prefix, []int{10}, Field{Key: []string{"x"}, DType: memmap.Int64, Shape: []int{10}}))
	defer td.Close()
	x := must[*Tensor](t)(td.Tensor("x"))
	heap := must[*Tensor](t)(Zeros(memmap.Int64, 10))
	src := must[*Tensor](t)(FromSlice([]int64{42}))
	for _, tc := range []struct {
		name string
		t    *Tensor
	}{
		{"mapped view of rows 5 to 9", must[*Tensor](t)(x.Slice(5, 10))},
		{"Go memory", heap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, start := range []int{math.MaxInt, math.MaxInt - 5} {
				if err := tc.t.SetSlice(start, src); !errors.Is(err, memmap.ErrIndex) {
					t.Errorf("SetSlice(%d): err = %v, want memmap.ErrIndex", start, err)
				}
			}
		})
	}
	for name, u := range map[string]*Tensor{"file": x, "Go memory": heap} {
		if got := must[[]int64](t)(Values[int64](u)); slices.ContainsFunc(got, func(v int64) bool { return v != 0 }) {
			t.Errorf("%s after refused SetSlices: %v, want all zeros", name, got)
		}
	}
}

// TestTensorDict_SetSliceHugeStartWritesNothing is the same through
// TensorDict.SetSlice on a view of rows [5, 10) of a mapped TensorDict:
// memmap.ErrIndex and the file unchanged. Before the fix it wrote row 4.
func TestTensorDict_SetSliceHugeStartWritesNothing(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "p")
	td := must[*TensorDict](t)(Create(prefix, []int{10}, Field{Key: []string{"x"}, DType: memmap.Int64, Shape: []int{10}}))
	defer td.Close()
	view := must[*TensorDict](t)(td.Slice(5, 10))
	src := mustNew(t, 1)
	noErr(t, src.Set("x", must[*Tensor](t)(FromSlice([]int64{42}))))
	if err := view.SetSlice(math.MaxInt, src); !errors.Is(err, memmap.ErrIndex) {
		t.Errorf("SetSlice(MaxInt): err = %v, want memmap.ErrIndex", err)
	}
	if got := values[int64](t, td, "x"); slices.ContainsFunc(got, func(v int64) bool { return v != 0 }) {
		t.Errorf("file after a refused SetSlice: %v, want all zeros", got)
	}
}

func TestStackAndCat(t *testing.T) {
	a, b := sample(t, 2), sample(t, 2)
	b.Fill([]int{0, 1}, 1)
	s := must[*TensorDict](t)(Stack([]*TensorDict{a, b}))
	if got := s.BatchSize(); !slices.Equal(got, []int{2, 2}) {
		t.Errorf("stack batch %v", got)
	}
	if got := must[*Tensor](t)(s.Tensor("obs")).Shape(); !slices.Equal(got, []int{2, 2, 2}) {
		t.Errorf("stacked obs shape %v", got)
	}
	if got := values[int64](t, s, "action"); !slices.Equal(got, []int64{0, 10, 1, 1}) {
		t.Errorf("stacked action %v", got)
	}
	c := must[*TensorDict](t)(Cat([]*TensorDict{a, b, a}))
	if got := values[int64](t, c, "action"); !slices.Equal(got, []int64{0, 10, 1, 1, 0, 10}) {
		t.Errorf("cat action %v", got)
	}
	if r := must[*TensorDict](t)(c.Index(4)); !r.Equal(must[*TensorDict](t)(a.Index(0))) {
		t.Error("row 4 of cat(a, b, a) is not row 0 of a")
	}
	if _, err := Stack([]*TensorDict{a, sample(t, 3)}); !errors.Is(err, ErrBatchSize) {
		t.Errorf("stack of different batch sizes: err = %v, want ErrBatchSize", err)
	}
	odd := sample(t, 2)
	odd.Set("extra", must[*Tensor](t)(Zeros(memmap.Uint8, 2)))
	if _, err := Cat([]*TensorDict{odd, a}); !errors.Is(err, ErrSchema) {
		t.Errorf("cat of different schemas: err = %v, want ErrSchema", err)
	}
}

// TestStack_ComparesWholeShapes stacks TensorDicts without batch
// dimensions whose "x" is shaped [1], [2] and [0]: their schemas differ, so
// it is an error wrapping ErrSchema, while Cat of such rows (batch [1],
// [2], [0]) still adds them up. Before the fix Stack compared only the
// shapes past the first dimension and made a [3 1] tensor of the 3
// elements.
func TestStack_ComparesWholeShapes(t *testing.T) {
	mk := func(batch []int, vals ...float32) *TensorDict {
		td := mustNew(t, batch...)
		noErr(t, td.Set("x", must[*Tensor](t)(FromSlice(vals))))
		return td
	}
	got, err := Stack([]*TensorDict{mk(nil, 1), mk(nil, 2, 3), mk(nil)})
	if !errors.Is(err, ErrSchema) {
		if err == nil {
			err = fmt.Errorf("x %v = %v", must[*Tensor](t)(got.Tensor("x")).Shape(), values[float32](t, got, "x"))
		}
		t.Errorf("Stack of x shaped [1], [2], [0]: %v, want ErrSchema", err)
	}
	c := must[*TensorDict](t)(Cat([]*TensorDict{mk([]int{1}, 1), mk([]int{2}, 2, 3), mk([]int{0})}))
	if x := values[float32](t, c, "x"); !slices.Equal(x, []float32{1, 2, 3}) {
		t.Errorf("Cat of x shaped [1], [2], [0] = %v, want [1 2 3]", x)
	}
}

func TestTensorDict_ApplyCloneEqual(t *testing.T) {
	td := sample(t, 3)
	c := must[*TensorDict](t)(td.Clone())
	if !c.Equal(td) {
		t.Fatal("clone differs")
	}
	c.Fill([]int{0}, 5)
	if c.Equal(td) {
		t.Error("clone shares storage with the source")
	}
	twice := must[*TensorDict](t)(td.Apply(func(_ []string, x *Tensor) (*Tensor, error) {
		out := must[*Tensor](t)(x.Clone())
		if x.DType() == memmap.Int64 {
			v := must[[]int64](t)(Values[int64](out))
			for i := range v {
				v[i] *= 2
			}
			return FromSlice(v, x.Shape()...)
		}
		return out, nil
	}))
	if got := values[int64](t, twice, "action"); !slices.Equal(got, []int64{0, 20, 40}) {
		t.Errorf("applied action %v", got)
	}
	if _, err := td.Apply(func(_ []string, x *Tensor) (*Tensor, error) { return Zeros(x.DType(), 1) }); !errors.Is(err, ErrBatchSize) {
		t.Errorf("Apply dropping the batch dimension: err = %v, want ErrBatchSize", err)
	}
}

func TestTensor_FromAndToGo(t *testing.T) {
	x := must[*Tensor](t)(FromSlice([]uint16{0x3c00, 0xc000}))
	h := must[*Tensor](t)(x.WithDType(memmap.Float16))
	if h.DType() != memmap.Float16 {
		t.Fatalf("dtype %v", h.DType())
	}
	if _, err := x.WithDType(memmap.Float32); !errors.Is(err, memmap.ErrDType) {
		t.Errorf("WithDType to a wider type: err = %v, want ErrDType", err)
	}
	if _, err := Values[float32](h); !errors.Is(err, memmap.ErrDType) {
		t.Errorf("float16 read as float32: err = %v, want ErrDType", err)
	}
	d := must[*tensor.Dense](t)(h.Dense())
	if d.Dtype().Name() != "uint16" || d.Shape()[0] != 2 {
		t.Errorf("Dense of float16: %v %v", d.Dtype(), d.Shape())
	}
	back := must[*Tensor](t)(FromDense(d))
	if !back.Equal(x) {
		t.Error("FromDense(Dense()) differs")
	}
	if _, err := FromSlice([]float32{1, 2, 3}, 2, 2); !errors.Is(err, memmap.ErrShape) {
		t.Errorf("FromSlice with a wrong shape: err = %v, want ErrShape", err)
	}
}

// TestMemmapLike_FilledByAnotherProcess creates storage here, fills rows
// from a child process through its own LoadMemmap, and reads them here
// through the mapping made before the child ran.
func TestMemmapLike_FilledByAnotherProcess(t *testing.T) {
	if prefix := os.Getenv("TENSORDICT_TEST_CHILD"); prefix != "" {
		td, err := LoadMemmap(prefix)
		if err != nil {
			t.Fatal(err)
		}
		if err := td.SetSlice(2, sample(t, 3)); err != nil {
			t.Fatal(err)
		}
		if err := td.Flush(); err != nil {
			t.Fatal(err)
		}
		td.Close()
		return
	}
	prefix := filepath.Join(t.TempDir(), "ds")
	td := must[*TensorDict](t)(sample(t, 6).MemmapLike(prefix))
	defer td.Close()
	if got := values[int64](t, td, "action"); !slices.Equal(got, make([]int64, 6)) {
		t.Fatalf("MemmapLike storage is not zero: %v", got)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemmapLike_FilledByAnotherProcess$")
	cmd.Env = append(os.Environ(), "TENSORDICT_TEST_CHILD="+prefix)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if got := values[int64](t, td, "action"); !slices.Equal(got, []int64{0, 0, 0, 10, 20, 0}) {
		t.Errorf("action after the child's SetSlice(2, ...) = %v", got)
	}
	if got := values[bool](t, td, "next", "done"); !slices.Equal(got, []bool{false, false, false, true, false, false}) {
		t.Errorf("next/done after the child's SetSlice = %v", got)
	}
}

func TestTensorDict_GatherInto(t *testing.T) {
	td := sample(t, 5)
	dst := must[*TensorDict](t)(td.Gather([]int{0, 0}))
	if err := td.GatherInto(dst, []int{4, 2}); err != nil {
		t.Fatal(err)
	}
	want := must[*TensorDict](t)(td.Gather([]int{4, 2}))
	if !dst.Equal(want) {
		t.Errorf("GatherInto gave\n%v\nwant\n%v", dst, want)
	}
	if err := td.GatherInto(dst, []int{1, 2, 3}); !errors.Is(err, ErrBatchSize) {
		t.Errorf("three rows into a batch of two: err = %v, want ErrBatchSize", err)
	}
	if err := td.GatherInto(dst, []int{1, 7}); !errors.Is(err, memmap.ErrIndex) {
		t.Errorf("row out of range: err = %v, want ErrIndex", err)
	}
	if !dst.Equal(want) {
		t.Error("a refused GatherInto changed the destination")
	}
}

// TestTensor_RowCopies checks the Tensor-level row copies between every mix
// of Go memory and mapped storage, and their refusals.
func TestTensor_RowCopies(t *testing.T) {
	src := sample(t, 5)
	mapped := must[*TensorDict](t)(src.Memmap(filepath.Join(t.TempDir(), "p")))
	defer mapped.Close()
	for _, tc := range []struct {
		name     string
		from, to *TensorDict // rows are read from from, written into to
	}{
		{"memory to memory", src, must[*TensorDict](t)(src.Clone())},
		{"mapped to memory", mapped, must[*TensorDict](t)(src.Clone())},
		{"memory to mapped", src, must[*TensorDict](t)(src.MemmapLike(filepath.Join(t.TempDir(), "q")))},
		{"mapped to mapped", mapped, must[*TensorDict](t)(src.MemmapLike(filepath.Join(t.TempDir(), "r")))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.to.Close()
			from := must[*Tensor](t)(tc.from.Tensor("action"))
			to := must[*Tensor](t)(tc.to.Tensor("action"))
			// GatherInto a two-row slice of to: rows 3 and 1 of from.
			dst := must[*Tensor](t)(to.Slice(0, 2))
			if err := from.GatherInto(dst, []int{3, 1}); err != nil {
				t.Fatal(err)
			}
			// Scatter from's rows 0 and 4 into to's rows 4 and 2.
			if err := to.Scatter([]int{4, 2}, must[*Tensor](t)(from.Gather([]int{0, 4}))); err != nil {
				t.Fatal(err)
			}
			// SetSlice from's row 2 into to's row 3.
			if err := to.SetSlice(3, must[*Tensor](t)(from.Slice(2, 3))); err != nil {
				t.Fatal(err)
			}
			if got := must[[]int64](t)(Values[int64](to)); !slices.Equal(got, []int64{30, 10, 40, 20, 0}) {
				t.Errorf("action after the copies = %v, want [30 10 40 20 0]", got)
			}
			before := must[[]int64](t)(Values[int64](to))
			wrongDType := must[*Tensor](t)(Zeros(memmap.Int32, 2))
			for _, bad := range []struct {
				name string
				err  error
				want error
			}{
				{"GatherInto row out of range", from.GatherInto(dst, []int{0, 5}), memmap.ErrIndex},
				{"GatherInto wrong row count", from.GatherInto(dst, []int{0}), memmap.ErrShape},
				{"GatherInto wrong dtype", from.GatherInto(wrongDType, []int{0, 1}), memmap.ErrDType},
				{"Scatter row out of range", to.Scatter([]int{-1, 0}, dst), memmap.ErrIndex},
				{"Scatter wrong dtype", to.Scatter([]int{0, 1}, wrongDType), memmap.ErrDType},
				{"SetSlice past the end", to.SetSlice(4, dst), memmap.ErrIndex},
			} {
				if !errors.Is(bad.err, bad.want) {
					t.Errorf("%s: err = %v, want %v", bad.name, bad.err, bad.want)
				}
			}
			if got := must[[]int64](t)(Values[int64](to)); !slices.Equal(got, before) {
				t.Errorf("refused copies changed the destination: %v, was %v", got, before)
			}
		})
	}
}
