package importer

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/internal/npy"
	"github.com/tensorwire/tensorwire/memmap"
)

// BenchmarkNPY_Import times importing one .npy file of 2048 Atari-like
// frames (uint8 [2048, 84, 84, 4]: 57.8 MB), which the page cache holds,
// into a new dataset: writing rows nobody has touched, then the Flush that
// makes them durable. One op is one import; MB/s counts the data. Run it
// with
//
//	go test -run '^$' -bench NPY_Import -benchtime 20x ./importer
func BenchmarkNPY_Import(b *testing.B) {
	const n, frame = 2048, 84 * 84 * 4
	dir := b.TempDir()
	src := filepath.Join(dir, "obs.npy")
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	if err := npy.WriteHeader(w, npy.Header{DType: memmap.Uint8, Shape: []int{n, 84, 84, 4}}); err != nil {
		b.Fatal(err)
	}
	row := make([]byte, frame)
	for i := range n {
		for j := range row {
			row[j] = byte(i + j/336)
		}
		w.Write(row)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	files := []File{{Key: []string{"obs"}, Path: src}}
	b.SetBytes(n * frame)
	for i := 0; b.Loop(); i++ {
		prefix := filepath.Join(dir, "ds")
		if _, err := NPY(context.Background(), prefix, files, Options{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := os.RemoveAll(prefix); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
