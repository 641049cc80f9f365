package loader

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/importer"
)

// fashionPrefix imports Fashion-MNIST's training set for a benchmark, or
// skips it.
func fashionPrefix(b *testing.B) string {
	b.Helper()
	const dir = "/usr/share/datasets/fashion-mnist"
	images, labels := filepath.Join(dir, "train-images-idx3-ubyte.gz"), filepath.Join(dir, "train-labels-idx1-ubyte.gz")
	if _, err := os.Stat(images); err != nil {
		b.Skip("Fashion-MNIST is not installed (dataset-fashion-mnist)")
	}
	prefix := filepath.Join(b.TempDir(), "fmnist")
	if _, err := importer.IDX(context.Background(), prefix, []importer.Pair{{Images: images, Labels: labels}}, importer.Options{}); err != nil {
		b.Fatal(err)
	}
	return prefix
}

var fashionAugment = &Augment{Pad: 4, Flip: true, Mean: 0.2860, Std: 0.3530}

// BenchmarkLocal_FashionEpoch: what an independent loader spends on an
// epoch of Fashion-MNIST with the Augment transform, per sample.
func BenchmarkLocal_FashionEpoch(b *testing.B) {
	prefix := fashionPrefix(b)
	l, err := NewLocal(Config{Dataset: prefix, Seed: 1, Transform: fashionAugment, IndexKey: "index"}, Options{Batch: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		for batch, err := range l.Batches(context.Background()) {
			if err != nil {
				b.Fatal(err)
			}
			n += batch.Len()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/sample")
}

// BenchmarkConsumer_FashionEpoch: a consumer's side of the same epoch,
// its producer in this process too (so the figure includes it).
func BenchmarkConsumer_FashionEpoch(b *testing.B) {
	prefix := fashionPrefix(b)
	f := &fixture{root: filepath.Dir(prefix), dataset: prefix}
	p, err := NewProducer(Config{Dataset: prefix, Dir: filepath.Join(f.root, "ring"), Batch: 256, Slots: 16, Seed: 1, Transform: fashionAugment, IndexKey: "index"})
	if err != nil {
		b.Fatal(err)
	}
	f.p = p
	f.serve(b)
	defer func() { f.srv.Close(); p.Close() }()
	c := f.dial(b, 64, false)
	b.ResetTimer()
	n := 0
	for b.Loop() {
		for batch, err := range c.Batches(context.Background()) {
			if err != nil {
				b.Fatal(err)
			}
			n += batch.Len()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/sample")
}
