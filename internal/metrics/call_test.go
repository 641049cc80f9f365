package metrics

import (
	"context"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tensorwire/tensorwire/rpc"
)

type echoMsg struct {
	Name string `codec:"name"`
	B    []byte `codec:"b"`
}

// BenchmarkCall_Observed is rpc's small-call benchmark (16 callers of
// 16-byte echoes on one connection) on a server without an observer (off)
// and with a metrics.Node (on): what --metrics costs a node's calls.
//
//	go test -run '^$' -bench Call_Observed -count 6 ./internal/metrics/
func BenchmarkCall_Observed(b *testing.B) {
	for _, observed := range []bool{false, true} {
		name := "off"
		var opts []rpc.Option
		if observed {
			name = "on"
			n, err := New(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, rpc.WithObserver(n))
		}
		b.Run(name, func(b *testing.B) {
			s, err := rpc.NewServer(opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			rpc.Register(s, "bench.echo", func(_ context.Context, m echoMsg) (echoMsg, error) { return m, nil })
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go s.Serve(l)
			ctx := context.Background()
			c, err := rpc.Dial(ctx, l.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				m := echoMsg{Name: "buf", B: make([]byte, 16)}
				for pb.Next() {
					if _, err := rpc.Call[echoMsg](ctx, c, "bench.echo", m); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
