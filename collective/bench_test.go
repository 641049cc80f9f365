package collective

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// BenchmarkAllreduce: ranks as goroutines of this process, each with its
// own Comm over real sockets or mappings (tensorwire bench collective runs
// them as processes).
func BenchmarkAllreduce(b *testing.B) {
	for _, tr := range transports() {
		for _, size := range []int{1 << 10, 16 << 20} {
			b.Run(fmt.Sprintf("%s/2ranks/%dB", tr, size), func(b *testing.B) {
				comms := group(b, 2, tr)
				xs := make([]*tensordict.Tensor, 2)
				for r := range xs {
					xs[r], _ = tensordict.Zeros(memmap.Float32, size/4)
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
}
