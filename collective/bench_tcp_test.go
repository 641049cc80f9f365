//go:build unix

package collective

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

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
			cpu0 := cpuTime()
			allreduceEach(b, comms, xs)
			b.StopTimer()
			// CPU time is steadier than wall time on a loaded machine.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime returns the user and system time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
