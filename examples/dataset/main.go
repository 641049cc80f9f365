// Command dataset builds an on-disk dataset of named tensors and reads random
// batches from it in a second process, the way a data loader would.
//
//	go run ./examples/dataset [--prefix DIR] [--batch 256] [--seconds 3]
//
// It builds Fashion-MNIST (images uint8 [70000, 28, 28], labels int64
// [70000]) from the Debian package dataset-fashion-mnist when it is
// installed, with importer.IDX (what "tensorwire import idx" runs), or a
// synthetic dataset of the same shape when it is not, with tensordict.Create
// and SetSlice one batch at a time. A second process maps the same files
// read-only and gathers random batches, checking every label, and prints
// rows/s and MB/s. The files are tensordict's format:
// TensorDict.load_memmap(DIR) opens them in Python.
//
// Without --prefix the dataset goes to a temporary folder that is removed at
// the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/tensorwire/tensorwire/importer"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

const fashionDir = "/usr/share/datasets/fashion-mnist"

func main() {
	prefix := flag.String("prefix", "", "folder for the dataset (default: a temporary one, removed at the end)")
	batch := flag.Int("batch", 256, "rows per random batch")
	seconds := flag.Float64("seconds", 3, "how long the reader reads")
	read := flag.String("read", "", "internal: read batches from this prefix (the second process)")
	flag.Parse()
	if *read != "" {
		if err := readBatches(*read, *batch, time.Duration(*seconds*float64(time.Second))); err != nil {
			fmt.Fprintln(os.Stderr, "reader:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*prefix, *batch, *seconds); err != nil {
		fmt.Fprintln(os.Stderr, "dataset:", err)
		os.Exit(1)
	}
}

func run(prefix string, batch int, seconds float64) error {
	if prefix == "" {
		dir, err := os.MkdirTemp("", "tensorwire-dataset-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		prefix = filepath.Join(dir, "fashion-mnist")
	}
	start := time.Now()
	source, err := build(prefix)
	if err != nil {
		return err
	}
	slog.Info("built", "prefix", prefix, "source", source, "took", time.Since(start).Round(time.Millisecond))

	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "--read", prefix, "--batch", fmt.Sprint(batch), "--seconds", fmt.Sprint(seconds))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// build writes the dataset at prefix and says where it came from: Fashion-
// MNIST's training and test sets through importer.IDX, or synthetic rows of
// the same shape.
func build(prefix string) (string, error) {
	var pairs []importer.Pair
	for _, set := range []string{"train", "t10k"} {
		pairs = append(pairs, importer.Pair{
			Images: filepath.Join(fashionDir, set+"-images-idx3-ubyte.gz"),
			Labels: filepath.Join(fashionDir, set+"-labels-idx1-ubyte.gz"),
		})
	}
	if _, err := os.Stat(pairs[0].Images); err == nil {
		_, err := importer.IDX(context.Background(), prefix, pairs, importer.Options{})
		return "Fashion-MNIST", err
	}
	slog.Info("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist); using synthetic data")
	return "synthetic", buildSynthetic(prefix, 70000)
}

// buildSynthetic creates storage for n rows of images uint8 [n, 28, 28] and
// labels int64 [n] with tensordict.Create and fills it batch by batch with
// SetSlice: the way to write a dataset of your own.
func buildSynthetic(prefix string, n int) error {
	td, err := tensordict.Create(prefix, []int{n},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{n, 28, 28}},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{n}},
	)
	if err != nil {
		return err
	}
	defer td.Close()
	const step = 1000
	images := make([]byte, step*28*28)
	labels := make([]int64, step)
	for start := 0; start < n; start += step {
		rows := min(step, n-start)
		for i := range rows {
			labels[i] = int64((start + i) % 10)
			fillImage(images[i*28*28:(i+1)*28*28], byte(start+i))
		}
		im, err := tensordict.FromBytes(memmap.Uint8, []int{rows, 28, 28}, images[:rows*28*28])
		if err != nil {
			return err
		}
		lb, err := tensordict.FromSlice(labels[:rows])
		if err != nil {
			return err
		}
		batch, err := tensordict.New(rows)
		if err != nil {
			return err
		}
		if err := batch.Set("images", im); err != nil {
			return err
		}
		if err := batch.Set("labels", lb); err != nil {
			return err
		}
		if err := td.SetSlice(start, batch); err != nil {
			return err
		}
	}
	return td.Flush()
}

// fillImage sets an image to a pattern that differs from row to row.
func fillImage(img []byte, seed byte) {
	for j := range img {
		img[j] = seed + byte(j)
	}
}

// readBatches maps the dataset read-only and gathers random batches for d
// into one reused batch (GatherInto: no allocation per batch), checking that
// every label is a class, then prints the throughput.
func readBatches(prefix string, batch int, d time.Duration) error {
	td, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		return err
	}
	defer td.Close()
	n := td.Len()
	rng := rand.New(rand.NewPCG(1, 2))
	idx := make([]int, batch)
	b, err := td.Gather(idx) // the batch buffer, in Go memory
	if err != nil {
		return err
	}
	labels, err := b.Tensor("labels")
	if err != nil {
		return err
	}
	var rows, bytes int
	start := time.Now()
	for time.Since(start) < d {
		for i := range idx {
			idx[i] = rng.IntN(n)
		}
		if err := td.GatherInto(b, idx); err != nil {
			return err
		}
		vals, err := tensordict.Values[int64](labels)
		if err != nil {
			return err
		}
		for i, v := range vals {
			if v < 0 || v > 9 {
				return fmt.Errorf("row %d has label %d, not a class 0..9", idx[i], v)
			}
		}
		rows += batch
		bytes += b.NumBytes()
	}
	el := time.Since(start).Seconds()
	fmt.Printf("reader (pid %d): %s, %d rows, batch %d: %.0f rows/s, %.1f MB/s (random batches, warm page cache, labels checked)\n",
		os.Getpid(), prefix, n, batch, float64(rows)/el, float64(bytes)/el/1e6)
	fmt.Println(td)
	return nil
}
