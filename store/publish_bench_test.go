package store

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// BenchmarkPublish_10MB publishes a 10 MiB float32 parameter set into a
// store in this process, with the default options (every prefix and
// record fsynced): the by-reference Publish's work without the network or
// the readers, for profiling and for before/after runs side by side.
func BenchmarkPublish_10MB(b *testing.B) {
	s := openT(b, b.TempDir(), Options{})
	data := make([]byte, 10<<20)
	rand.Read(data)
	w, err := tensordict.FromBytes(memmap.Float32, []int{len(data) / 4}, data)
	if err != nil {
		b.Fatal(err)
	}
	td, _ := tensordict.New()
	td.Set("w", w)
	ctx := context.Background()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Publish(ctx, "p", td); err != nil {
			b.Fatal(err)
		}
	}
}
