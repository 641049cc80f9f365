// Command dataset builds an on-disk dataset of named tensors and reads random
// batches from it in a second process, the way a data loader would.
//
//	go run ./examples/dataset [--prefix DIR] [--batch 256] [--seconds 3]
//
// It builds Fashion-MNIST (images uint8 [70000, 28, 28], labels int64
// [70000]) from the Debian package dataset-fashion-mnist when it is
// installed, or a synthetic dataset of the same shape when it is not, with
// tensordict.Create and SetSlice one batch at a time, then flushes it. A
// second process maps the same files read-only and gathers random batches,
// checking every label, and prints rows/s and MB/s. The files are
// tensordict's format: TensorDict.load_memmap(DIR) opens them in Python.
//
// Without --prefix the dataset goes to a temporary folder that is removed at
// the end.
package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/tensorwire/tensorwire/internal/idx"
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
	src, err := openSource()
	if err != nil {
		return err
	}
	if err := build(prefix, src); err != nil {
		return err
	}
	slog.Info("built", "prefix", prefix, "source", src.name, "rows", src.rows, "took", time.Since(start).Round(time.Millisecond))

	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "--read", prefix, "--batch", fmt.Sprint(batch), "--seconds", fmt.Sprint(seconds))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// source yields the dataset in batches of rows: images [n, 28, 28] bytes and
// their labels.
type source struct {
	name string
	rows int
	next func(images []byte, labels []int64) error
}

// openSource opens Fashion-MNIST's training and test files, or a synthetic
// stand-in of the same size if they are not installed.
func openSource() (*source, error) {
	var files [][2]string
	for _, set := range []string{"train", "t10k"} {
		files = append(files, [2]string{
			filepath.Join(fashionDir, set+"-images-idx3-ubyte.gz"),
			filepath.Join(fashionDir, set+"-labels-idx1-ubyte.gz"),
		})
	}
	if _, err := os.Stat(files[0][0]); err != nil {
		slog.Info("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist); using synthetic data")
		row := 0
		return &source{name: "synthetic", rows: 70000, next: func(images []byte, labels []int64) error {
			for i := range labels {
				labels[i] = int64((row + i) % 10)
				for j := range 28 * 28 {
					images[i*28*28+j] = byte(row + i + j)
				}
			}
			row += len(labels)
			return nil
		}}, nil
	}
	// The pairs are read one after the other: train (60000), then t10k (10000).
	var readers [][2]*idx.ReadCloser
	rows := 0
	for _, f := range files {
		im, err := idx.Open(f[0])
		if err != nil {
			return nil, err
		}
		lb, err := idx.Open(f[1])
		if err != nil {
			return nil, err
		}
		readers = append(readers, [2]*idx.ReadCloser{im, lb})
		rows += im.Header().Shape[0]
	}
	cur, left := 0, readers[0][0].Header().Shape[0]
	var raw []byte
	return &source{name: "Fashion-MNIST", rows: rows, next: func(images []byte, labels []int64) error {
		for done := 0; done < len(labels); {
			if left == 0 {
				readers[cur][0].Close()
				readers[cur][1].Close()
				cur++
				left = readers[cur][0].Header().Shape[0]
			}
			n := min(left, len(labels)-done)
			if _, err := io.ReadFull(readers[cur][0], images[done*28*28:(done+n)*28*28]); err != nil {
				return err
			}
			if cap(raw) < n {
				raw = make([]byte, n)
			}
			raw = raw[:n]
			if _, err := io.ReadFull(readers[cur][1], raw); err != nil {
				return err
			}
			for i, b := range raw {
				labels[done+i] = int64(b)
			}
			done += n
			left -= n
		}
		return nil
	}}, nil
}

// build creates the dataset's storage at prefix and fills it batch by batch.
func build(prefix string, src *source) error {
	td, err := tensordict.Create(prefix, []int{src.rows},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{src.rows, 28, 28}},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{src.rows}},
	)
	if err != nil {
		return err
	}
	defer td.Close()
	const step = 1000
	images := make([]byte, step*28*28)
	labels := make([]int64, step)
	for start := 0; start < src.rows; start += step {
		n := min(step, src.rows-start)
		if err := src.next(images[:n*28*28], labels[:n]); err != nil {
			return fmt.Errorf("row %d: %w", start, err)
		}
		rows, err := tensordict.New(n)
		if err != nil {
			return err
		}
		im, err := tensordict.FromBytes(memmap.Uint8, []int{n, 28, 28}, images[:n*28*28])
		if err != nil {
			return err
		}
		lb, err := tensordict.FromSlice(labels[:n])
		if err != nil {
			return err
		}
		rows.Set("images", im)
		rows.Set("labels", lb)
		if err := td.SetSlice(start, rows); err != nil {
			return err
		}
	}
	return td.Flush()
}

// readBatches maps the dataset read-only and gathers random batches for d,
// checking that every label is a class, then prints the throughput.
func readBatches(prefix string, batch int, d time.Duration) error {
	td, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		return err
	}
	defer td.Close()
	n := td.Len()
	rng := rand.New(rand.NewPCG(1, 2))
	idx := make([]int, batch)
	var rows, bytes int
	start := time.Now()
	for time.Since(start) < d {
		for i := range idx {
			idx[i] = rng.IntN(n)
		}
		b, err := td.Gather(idx)
		if err != nil {
			return err
		}
		labels, err := b.Tensor("labels")
		if err != nil {
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
