package rpc

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

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
	RegisterStream(s, "sinkstream", func(ctx context.Context, _ Empty, st *ServerStream[benchPayload, Empty]) error {
		st.ReuseBuffers() // as benchmarks/rpc's handler: each message dropped before the next
		for {
			if _, err := st.Recv(ctx); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	})
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
	b.Run("stream1MiB", func(b *testing.B) {
		// Messages of 1 MiB on one message stream, as benchmarks/rpc's
		// stream workload sends them.
		ctx := Uncompressed(ctx)
		x, _ := tensordict.Zeros(memmap.Uint8, 1<<20)
		td, _ := tensordict.New(1 << 20)
		td.Set("x", x)
		st, err := OpenStream[benchPayload, Empty](ctx, c, "sinkstream", Empty{})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		b.SetBytes(1 << 20)
		for b.Loop() {
			if err := st.Send(ctx, benchPayload{Data: Ref(td)}); err != nil {
				b.Fatal(err)
			}
		}
		st.CloseSend(ctx)
		if _, err := st.Recv(ctx); err != io.EOF {
			b.Fatal(err)
		}
	})
	b.Run("bulk6MB", func(b *testing.B) {
		ctx := Uncompressed(ctx) // zeros: as they are, to compare with benchmarks/rpc
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

// BenchmarkCompression sends bytes-mode TDs to a handler over loopback TCP,
// compressed when it pays (lz4) and with compression off for the call
// (off), side by side on one connection: 32 Atari-like observations (uint8
// [32, 84, 84, 4], 903 KB, mostly constant background), and 6 MiB and
// 64 KiB of random float32, on which the sample finds nothing to gain.
// ratio is the
// body's bytes on the wire over its bytes.
//
//	go test -run '^$' -bench Compression -count 6 ./rpc/
func BenchmarkCompression(b *testing.B) {
	s, addr := startServer(b)
	Register(s, "sink", func(_ context.Context, p benchPayload) (benchMsg, error) { return benchMsg{}, nil })
	RegisterStream(s, "sinkstream", func(ctx context.Context, _ Empty, st *ServerStream[benchPayload, Empty]) error {
		st.ReuseBuffers() // as benchmarks/rpc's handler: each message dropped before the next
		for {
			if _, err := st.Recv(ctx); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	})
	c := dial(b, addr)
	for _, data := range []struct {
		name string
		td   *tensordict.TensorDict
	}{
		{"atari", atariTD(32)},
		{"float32", randomFloatTD(1536)},
		{"float32-64KiB", randomFloatTD(16)},
	} {
		var parts []bodyPart
		for _, x := range data.td.Leaves() {
			parts = append(parts, bodyPart{t: x})
		}
		body := sealBody(parts, true)
		ratio := float64(body.wireLen()) / float64(body.raw)
		body.release()
		for _, mode := range []string{"lz4", "off"} {
			b.Run(data.name+"/"+mode, func(b *testing.B) {
				ctx := context.Background()
				r := ratio
				if mode == "off" {
					ctx, r = Uncompressed(ctx), 1
				}
				b.SetBytes(body.raw)
				for b.Loop() {
					if _, err := Call[benchMsg](ctx, c, "sink", benchPayload{Data: Ref(data.td)}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(r, "ratio")
			})
		}
		// Both modes alternating call by call, so that the machine's
		// drift (other processes, the heap) falls on both alike; medians,
		// so that a collection or a preemption does not decide.
		b.Run(data.name+"/alternating", func(b *testing.B) {
			var took [2][]time.Duration
			ctxs := [2]context.Context{context.Background(), Uncompressed(context.Background())}
			b.SetBytes(body.raw)
			i := 0
			for b.Loop() {
				m := i % 2
				start := time.Now()
				if _, err := Call[benchMsg](ctxs[m], c, "sink", benchPayload{Data: Ref(data.td)}); err != nil {
					b.Fatal(err)
				}
				took[m] = append(took[m], time.Since(start))
				i++
			}
			if len(took[1]) > 0 {
				lz, off := float64(median(took[0])), float64(median(took[1]))
				b.ReportMetric(lz, "ns/lz4-call")
				b.ReportMetric(off, "ns/off-call")
				b.ReportMetric(100*(lz/off-1), "%lz4-extra")
			}
		})
		// What deciding costs: the sample, and the compression when it pays.
		b.Run(data.name+"/seal", func(b *testing.B) {
			b.SetBytes(body.raw)
			for b.Loop() {
				body := sealBody(parts, true)
				body.release()
			}
		})
	}
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
