package tensordict_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
	"gorgonia.org/tensor"
)

// Create storage for a dataset on disk, fill it batch by batch, and open it
// again (in this process here; another process, or Python's
// TensorDict.load_memmap, would do the same).
func ExampleCreate() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	prefix := filepath.Join(dir, "dataset")

	td, err := tensordict.Create(prefix, []int{6},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{6, 2, 2}},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{6}},
	)
	if err != nil {
		log.Fatal(err)
	}
	for start := 0; start < 6; start += 3 { // two batches of three rows
		batch, _ := tensordict.New(3)
		images, _ := tensordict.FromSlice(make([]uint8, 3*4), 3, 2, 2)
		labels, _ := tensordict.FromSlice([]int64{int64(start), int64(start + 1), int64(start + 2)})
		batch.Set("images", images)
		batch.Set("labels", labels)
		if err := td.SetSlice(start, batch); err != nil {
			log.Fatal(err)
		}
	}
	if err := td.Flush(); err != nil {
		log.Fatal(err)
	}
	td.Close()

	loaded, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		log.Fatal(err)
	}
	defer loaded.Close()
	rows, _ := loaded.Gather([]int{5, 0})
	labels, _ := rows.Tensor("labels")
	v, _ := tensordict.Values[int64](labels)
	fmt.Println(loaded.BatchSize(), loaded.Keys(), v)
	// Output: [6] [images labels] [5 0]
}

// Describe a row once, without the batch dimension, and make batches of
// it: in Go memory (Zeros), on disk (Create), or as the full Fields that
// Create takes. A batch gives its row schema back.
func ExampleRowSchema() {
	row := tensordict.RowSchema{
		{Key: []string{"image"}, DType: memmap.Uint8, Shape: []int{28, 28}},
		{Key: []string{"label"}, DType: memmap.Int64},
	}
	if err := row.Validate(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(row.RowBytes(), "bytes a row")
	for _, f := range row.Fields(70000) {
		fmt.Println(f.Key, f.Shape)
	}
	batch, err := row.Zeros(32)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(batch.BatchSize(), row.Match(batch.RowSchema()))
	// Output:
	// 792 bytes a row
	// [image] [70000 28 28]
	// [label] [70000]
	// [32] <nil>
}

// Turn an in-memory TensorDict into a memory-mapped one, and index it: a
// range is a view of the files, a list of rows a copy.
func ExampleTensorDict_Memmap() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	td, _ := tensordict.New(4)
	obs, _ := tensordict.FromSlice([]float32{0, 1, 2, 3, 4, 5, 6, 7}, 4, 2)
	td.Set("obs", obs)
	reward, _ := tensordict.FromSlice([]float64{0.5, 1, 1.5, 2})
	td.SetPath([]string{"next", "reward"}, reward)

	m, err := td.Memmap(filepath.Join(dir, "td"))
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	view, _ := m.Slice(1, 3)
	view.Fill([]int{0}, -1) // writes row 1 of the mapped files
	o, _ := m.Tensor("obs")
	v, _ := tensordict.Values[float32](o)
	fmt.Println(v)
	fmt.Println(m)
	// Output:
	// [0 1 -1 -1 4 5 6 7]
	// TensorDict(
	//     fields={
	//         next: TensorDict(
	//             fields={
	//                 reward: MemoryMappedTensor(shape=torch.Size([4]), device=cpu, dtype=torch.float64, is_shared=False)},
	//             batch_size=torch.Size([4]),
	//             device=cpu,
	//             is_shared=False),
	//         obs: MemoryMappedTensor(shape=torch.Size([4, 2]), device=cpu, dtype=torch.float32, is_shared=False)},
	//     batch_size=torch.Size([4]),
	//     device=cpu,
	//     is_shared=False)
}

// Write a gorgonia *tensor.Dense to a file and view the file as a Dense again,
// without copying.
func ExampleCreateFromDense() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	d := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{0, 1, 2, 3, 4, 5}))
	mm, err := tensordict.CreateFromDense(filepath.Join(dir, "x.memmap"), d)
	if err != nil {
		log.Fatal(err)
	}
	defer mm.Close()
	x, _ := tensordict.View(mm, 0, mm.Shape()...)
	view, _ := x.Dense() // aliases the mapping: valid until mm.Close
	fmt.Println(mm.DType(), view.Shape(), view.Data())
	// Output: torch.float32 (2, 3) [0 1 2 3 4 5]
}

// Lay out a prefix without syncing, fill it, and make it durable with one
// sync pass (what a store does before renaming a new version into place).
func ExampleSyncPrefix() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	prefix := filepath.Join(dir, "v1")

	src, _ := tensordict.New(4)
	w, _ := tensordict.FromSlice([]float32{1, 2, 3, 4})
	src.Set("w", w)
	out, err := src.MemmapLike(prefix, tensordict.Unsynced()) // zeros, nothing synced yet
	if err != nil {
		log.Fatal(err)
	}
	ow, _ := out.Tensor("w")
	ow.SetSlice(0, w) // the data, through the mapping
	// Writes through a mapping are flushed before the sync pass (needed
	// off Linux, where fsync may not write back a mapping's pages).
	if err := out.Flush(); err != nil {
		log.Fatal(err)
	}
	out.Close()
	if err := tensordict.SyncPrefix(prefix); err != nil { // each file, then each folder
		log.Fatal(err)
	}
	back, _ := tensordict.LoadMemmap(prefix)
	defer back.Close()
	bw, _ := back.Tensor("w")
	v, _ := tensordict.Values[float32](bw)
	fmt.Println(v)
	// Output: [1 2 3 4]
}
