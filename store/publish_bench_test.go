package store

import (
	"context"
	"crypto/rand"
	"sync"
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
	td := randomParams(b, 10<<20)
	ctx := context.Background()
	b.SetBytes(10 << 20)
	for b.Loop() {
		if _, err := s.Publish(ctx, "p", td); err != nil {
			b.Fatal(err)
		}
	}
}

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
	ctx := context.Background()
	if _, err := pub.Publish(ctx, "p", randomParams(b, 10<<20)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(readers)) * 10 << 20)
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

// randomParams returns a parameter set of one float32 tensor "w" of n
// random bytes (incompressible, as trained weights are to lz4).
func randomParams(b *testing.B, n int) *tensordict.TensorDict {
	data := make([]byte, n)
	rand.Read(data)
	w, err := tensordict.FromBytes(memmap.Float32, []int{n / 4}, data)
	if err != nil {
		b.Fatal(err)
	}
	td, _ := tensordict.New()
	if err := td.Set("w", w); err != nil {
		b.Fatal(err)
	}
	return td
}

// BenchmarkPublish_Bytes10MB publishes a 10 MiB parameter set from a client
// that does not share the node's files, over loopback TCP in this process:
// the body on the wire, the node writing and syncing the version, and the
// answer, for profiling and for before/after runs side by side.
func BenchmarkPublish_Bytes10MB(b *testing.B) {
	root := b.TempDir()
	n := serveStore(b, root, "st", Options{})
	pub := dialT(b, n.addr, "st", root, "bytes")
	td := randomParams(b, 10<<20)
	ctx := context.Background()
	b.SetBytes(10 << 20)
	for b.Loop() {
		if _, err := pub.Publish(ctx, "p", td); err != nil {
			b.Fatal(err)
		}
	}
}
