package serve

import (
	"context"
	"sync"
	"testing"
)

// BenchmarkManager_Predict is in-process predictions of one row by 8
// goroutines on the test model: the manager's own cost per request.
func BenchmarkManager_Predict(b *testing.B) {
	m, err := New(testConfig(&behaviour{}, 16))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	in := rowsOf(b, 1, 1)
	b.SetParallelism(4) // 8 goroutines on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := m.Predict(context.Background(), in); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(m.Stats().MeanBatch(), "rows/batch")
}

// BenchmarkRemote_Predict is predictions of one row by 8 clients, each
// with its own connection, over loopback: by reference and by bytes.
func BenchmarkRemote_Predict(b *testing.B) {
	for _, mode := range []string{"ref", "bytes"} {
		b.Run(mode, func(b *testing.B) {
			root := b.TempDir()
			n := serveModelB(b, root, testConfig(&behaviour{}, 16))
			var clients []*Client
			for range 8 {
				opts := []DialOption{WithRoot(root)}
				if mode == "bytes" {
					opts = append(opts, WithBytes())
				}
				c, err := Dial(context.Background(), n.addr, "model", opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				clients = append(clients, c)
			}
			in := rowsOf(b, 1, 1)
			var mu sync.Mutex
			next := 0
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				c := clients[next%len(clients)]
				next++
				mu.Unlock()
				for pb.Next() {
					if _, _, err := c.Predict(context.Background(), in); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(n.m.Stats().MeanBatch(), "rows/batch")
		})
	}
}
