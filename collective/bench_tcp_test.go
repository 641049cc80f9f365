package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

// BenchmarkAllreduceTCP4 is a 4-rank Allreduce over loopback TCP (ranks as
// goroutines, each with its own Comm and sockets) on random floats, which
// no compression shrinks: the profile of the TCP data path
// (go test -bench AllreduceTCP4 -cpuprofile).
func BenchmarkAllreduceTCP4(b *testing.B) {
	for _, size := range []int{1 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			comms := group(b, 4, TCP)
			xs := make([]*tensordict.Tensor, len(comms))
			for r := range xs {
				v := make([]float32, size/4)
				for i := range v {
					v[i] = rand.Float32()
				}
				xs[r], _ = tensordict.FromSlice(v)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			var wg sync.WaitGroup
			for r, c := range comms {
				wg.Go(func() {
					for range b.N {
						if err := c.AllreduceInto(context.Background(), xs[r], xs[r], Sum); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
