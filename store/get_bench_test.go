package store

import (
	"context"
	"crypto/rand"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// BenchmarkLatest_Bytes10MB4Readers has 4 clients that do not share the
// node's files take the latest version of a 10 MiB parameter set at once,
// over loopback TCP in this process: the node's side of a broadcast by
// bytes (the mapped version written to 4 side connections) and the
// clients' reads, for profiling and for before/after runs side by side.
func BenchmarkLatest_Bytes10MB4Readers(b *testing.B) {
	root := b.TempDir()
	n := serveStore(b, root, "st", Options{})
	pub := dialT(b, n.addr, "st", root, "bytes")
	var readers []*Client
	for range 4 {
		readers = append(readers, dialT(b, n.addr, "st", root, "bytes"))
	}
	data := make([]byte, 10<<20)
	rand.Read(data)
	w, err := tensordict.FromBytes(memmap.Float32, []int{len(data) / 4}, data)
	if err != nil {
		b.Fatal(err)
	}
	td, _ := tensordict.New()
	td.Set("w", w)
	ctx := context.Background()
	if _, err := pub.Publish(ctx, "p", td); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(readers) * len(data)))
	for b.Loop() {
		var wg sync.WaitGroup
		for _, rd := range readers {
			wg.Go(func() {
				p, err := rd.Latest(ctx, "p")
				if err != nil {
					b.Error(err)
					return
				}
				p.Close()
			})
		}
		wg.Wait()
	}
}
