//go:build unix

package store

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// BenchmarkAppend_Rollouts is the rollouts part of "tensorwire bench
// store" in one process, for profiling (go test -bench Append_Rollouts
// -cpuprofile F): a node, 4 clients by bytes with 8 Appends of 28 KB items
// in flight each, and a Get loop draining the bin. Its time per op is CPU
// and fsyncs per item on this machine; the figures to quote come from the
// benchmark, with tensorshare beside.
func BenchmarkAppend_Rollouts(b *testing.B) {
	root := b.TempDir()
	n := serveStore(b, root, "s", Options{})
	const clients, inflight = 4, 8
	cs := make([]*Client, clients)
	for i := range cs {
		cs[i] = dialT(b, n.addr, "s", root, "bytes")
	}
	drainer := dialT(b, n.addr, "s", root, "bytes")
	obs := make([]byte, 28<<10)
	rand.Read(obs) // incompressible, as the benchmark's: the rpc layer's lz4 gives up on it
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var drained atomic.Int64
	done := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			tds, err := drainer.Get(context.Background(), "data")
			if err != nil {
				done <- err
				return
			}
			drained.Add(int64(len(tds)))
		}
		done <- nil
	}()
	var next atomic.Int64
	b.SetBytes(int64(len(obs)))
	cpu0 := cpuTime()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, c := range cs {
		for range inflight {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > int64(b.N) {
						return
					}
					x, _ := tensordict.FromBytes(memmap.Uint8, []int{len(obs)}, obs)
					td, _ := tensordict.New()
					td.Set("obs", x)
					td.Set("key", &tensordict.NonTensor{Data: fmt.Sprint(i)})
					td.Set("crc", &tensordict.NonTensor{Data: uint32(i)})
					if _, err := c.Append(ctx, "data", td); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	b.StopTimer()
	// CPU time (user and system, every goroutine: clients, node, drainer)
	// per item: steadier than the time per item on a loaded machine.
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
