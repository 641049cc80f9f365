package rpc

import (
	"context"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

type benchMsg struct {
	B []byte `codec:"b"`
}

type benchPayload struct {
	Data TD `codec:"data"`
}

// BenchmarkCall measures calls in one process over loopback TCP: a 16-byte
// round trip from 16 goroutines, and a 6,144,000-byte request (5 rows of
// 640x640x3) sent as bytes. Compare with benchmarks/rpc for grpc and raw TCP.
func BenchmarkCall(b *testing.B) {
	s, addr := startServer(b)
	Register(s, "echo", func(_ context.Context, m benchMsg) (benchMsg, error) { return m, nil })
	Register(s, "sink", func(_ context.Context, p benchPayload) (benchMsg, error) { return benchMsg{}, nil })
	c := dial(b, addr)
	ctx := context.Background()

	b.Run("small16", func(b *testing.B) {
		b.SetParallelism(8) // 16 goroutines on 2 cores
		b.RunParallel(func(pb *testing.PB) {
			m := benchMsg{B: make([]byte, 16)}
			for pb.Next() {
				if _, err := Call[benchMsg](ctx, c, "echo", m); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("bulk6MB", func(b *testing.B) {
		x, _ := tensordict.Zeros(memmap.Uint8, 5, 640, 640, 3)
		td, _ := tensordict.New(5)
		td.Set("x", x)
		b.SetBytes(int64(x.NumBytes()))
		for b.Loop() {
			if _, err := Call[benchMsg](ctx, c, "sink", benchPayload{Data: Ref(td)}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
