package importer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/importer"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Import an IDX image/label pair (here two 2x3 images, written by hand; the
// MNIST files are the same format, usually gzipped) and load the result.
func ExampleIDX() {
	dir, err := os.MkdirTemp("", "importer-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	images := filepath.Join(dir, "images-idx3-ubyte")
	labels := filepath.Join(dir, "labels-idx1-ubyte")
	// An IDX header: 0 0, the type (8: uint8), the rank, then each dimension
	// as a big-endian uint32; then the data.
	os.WriteFile(images, []byte{0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3,
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 0o644)
	os.WriteFile(labels, []byte{0, 0, 8, 1, 0, 0, 0, 2, 7, 3}, 0o644)

	prefix := filepath.Join(dir, "ds")
	pairs := []importer.Pair{{Images: images, Labels: labels}}
	n, err := importer.IDX(context.Background(), prefix, pairs, importer.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows:", n)

	// A second import onto the dataset needs Force; onto anything that is
	// not a dataset (this file, say), Force would not help.
	_, err = importer.IDX(context.Background(), prefix, pairs, importer.Options{})
	fmt.Println("again:", errors.Is(err, importer.ErrExists))
	_, err = importer.IDX(context.Background(), labels, pairs, importer.Options{Force: true})
	fmt.Println("onto a file:", errors.Is(err, importer.ErrNotReplaceable))

	td, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		log.Fatal(err)
	}
	defer td.Close()
	l, _ := td.Tensor("labels")
	v, _ := tensordict.Values[int64](l)
	fmt.Println("labels:", v)
	x, _ := td.Tensor("images")
	fmt.Println("images:", x.DType(), x.Shape())
	// Output:
	// rows: 2
	// again: true
	// onto a file: true
	// labels: [7 3]
	// images: torch.uint8 [2 2 3]
}
