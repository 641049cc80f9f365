package loader

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/importer"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// sampleShape is a synthetic sample's shape: an ImageNet-sized image.
var sampleShape = []int{3, 224, 224}

// fashionShape is a Fashion-MNIST image's.
var fashionShape = []int{28, 28}

// fashionSamples is how many images Fashion-MNIST's training set has.
const fashionSamples = 60000

// prepare returns the prefix of workload d's dataset under dir, its
// samples and where it came from, making it unless it is there already
// (--data keeps it between runs).
func prepare(ctx context.Context, o *options, d, dir string, log *slog.Logger) (prefix string, n int, src string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, "", err
	}
	switch d {
	case synthetic:
		prefix = filepath.Join(dir, fmt.Sprintf("synthetic-%d", o.samples))
		src = fmt.Sprintf("synthetic: %d samples of uint8 %v", o.samples, sampleShape)
		if n, ok := existing(prefix); ok {
			return prefix, n, src, nil
		}
		log.Info("writing the synthetic dataset", "prefix", prefix, "samples", o.samples)
		return prefix, o.samples, src, writeSynthetic(prefix, o.samples)
	default:
		prefix = filepath.Join(dir, "fashion-mnist")
		images := filepath.Join(o.fashion, "train-images-idx3-ubyte.gz")
		labels := filepath.Join(o.fashion, "train-labels-idx1-ubyte.gz")
		_, err1 := os.Stat(images)
		_, err2 := os.Stat(labels)
		if err1 != nil || err2 != nil {
			prefix += "-synthetic"
			src = fmt.Sprintf("synthetic, Fashion-MNIST's shape (%s not found)", o.fashion)
			if n, ok := existing(prefix); ok {
				return prefix, n, src, nil
			}
			log.Info("Fashion-MNIST not found: writing a synthetic set of its shape", "dir", o.fashion)
			return prefix, fashionSamples, src, writeFashionLike(prefix)
		}
		src = "Fashion-MNIST " + images
		if n, ok := existing(prefix); ok {
			return prefix, n, src, nil
		}
		log.Info("importing Fashion-MNIST", "from", o.fashion, "prefix", prefix)
		n, err := importer.IDX(ctx, prefix, []importer.Pair{{Images: images, Labels: labels}}, importer.Options{})
		return prefix, n, src, err
	}
}

// existing returns the rows of the dataset at prefix, if one is there.
func existing(prefix string) (int, bool) {
	td, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		return 0, false
	}
	defer td.Close()
	return td.Len(), td.Len() > 0
}

// writeSynthetic writes tensorsocket's benchmark dataset: "images" uint8
// [n, 3, 224, 224], sample i's first and last 8 bytes i (little-endian),
// every other byte (7i+3) mod 256.
func writeSynthetic(prefix string, n int) error {
	td, err := tensordict.Create(prefix, []int{n},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: append([]int{n}, sampleShape...)})
	if err != nil {
		return err
	}
	img, err := td.Tensor("images")
	if err == nil {
		err = fillRows(img, func(i int, row []byte) {
			for j := range row {
				row[j] = byte(7*i + 3)
			}
			binary.LittleEndian.PutUint64(row, uint64(i))
			binary.LittleEndian.PutUint64(row[len(row)-8:], uint64(i))
		})
	}
	if err == nil {
		// Written back now, not by the kernel during the first runs.
		err = td.Flush()
	}
	if err != nil {
		td.Close()
		os.RemoveAll(prefix)
		return err
	}
	return td.Close()
}

// writeFashionLike writes a stand-in for Fashion-MNIST's training set:
// "images" uint8 [60000, 28, 28] of a pattern, "labels" int64.
func writeFashionLike(prefix string) error {
	n := fashionSamples
	td, err := tensordict.Create(prefix, []int{n},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: append([]int{n}, fashionShape...)},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{n}})
	if err != nil {
		return err
	}
	img, err := td.Tensor("images")
	if err == nil {
		err = fillRows(img, func(i int, row []byte) {
			for j := range row {
				row[j] = byte(i*31 + j*7)
			}
		})
	}
	if err == nil {
		var lbl *tensordict.Tensor
		if lbl, err = td.Tensor("labels"); err == nil {
			err = fillRows(lbl, func(i int, row []byte) { binary.LittleEndian.PutUint64(row, uint64(i%10)) })
		}
	}
	if err != nil {
		td.Close()
		os.RemoveAll(prefix)
		return err
	}
	return td.Close()
}

// fillRows writes every row of t, a tensor being made, with fill.
func fillRows(t *tensordict.Tensor, fill func(i int, row []byte)) error {
	rb := t.RowBytes()
	if rb <= 0 {
		return errors.New("rows of no bytes")
	}
	buf := make([]byte, rb)
	for i := range t.Len() {
		fill(i, buf)
		if _, err := t.WriteAt(buf, int64(i)*int64(rb)); err != nil {
			return err
		}
	}
	return nil
}
