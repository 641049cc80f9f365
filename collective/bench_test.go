package collective

import (
	"context"
	"fmt"
	"os"
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
				allreduceEach(b, group(b, 2, tr), zerosEach(2, size))
			})
		}
	}
}

// BenchmarkShmAllreduce is Allreduce in place through shared mappings in
// /dev/shm (as the bench's ranks use), at 2 and 4 ranks and 1, 16 and 64
// MiB: a profile of where the bytes go (-cpuprofile covers every rank,
// goroutines of this process). Not a timing of the waits: a goroutine
// asleep in the futex holds its P until the runtime's monitor retakes it,
// which ranks that are processes do not pay; time those with "tensorwire
// bench collective".
func BenchmarkShmAllreduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range []int{1 << 20, 16 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("%dranks/%dMiB", n, size>>20), func(b *testing.B) {
				allreduceEach(b, groupIn(b, n, SHM, shmTempDir(b)), zerosEach(n, size))
			})
		}
	}
}

// zerosEach returns n tensors of size bytes of float32 zeros, a rank's
// each.
func zerosEach(n, size int) []*tensordict.Tensor {
	xs := make([]*tensordict.Tensor, n)
	for r := range xs {
		xs[r], _ = tensordict.Zeros(memmap.Float32, size/4)
	}
	return xs
}

// allreduceEach times b.N Sum Allreduces of xs[r] in place on each rank
// r of comms at once (ranks as goroutines), b's bytes an op the bytes of
// one rank's tensor. The timer is reset at its start and runs on after.
func allreduceEach(b *testing.B, comms []*Comm, xs []*tensordict.Tensor) {
	b.SetBytes(int64(xs[0].NumBytes()))
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
}

// shmTempDir returns a folder under /dev/shm (memory, as the bench's
// ranks use; t.TempDir may be on a disk), removed when b ends.
func shmTempDir(b *testing.B) string {
	d, err := os.MkdirTemp("/dev/shm", "tensorwire-bench-")
	if err != nil {
		b.Skipf("no /dev/shm: %v", err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}
