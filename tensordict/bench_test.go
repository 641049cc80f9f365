package tensordict

import (
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/memmap"
)

// BenchmarkTensorDict measures the seed's workload through the TensorDict
// API: a memory-mapped {"memmap": uint8 [1000, 640, 640, 3]} (1.2 GB), 5
// distinct random rows per operation, warm: the same rows were moved the same way
// just before (untimed), as benchmarks/gather does. Rows last touched long
// ago run slower (page-walk caches are cold), and writes to pages the kernel
// has written back since take a soft fault per page to be marked dirty again:
// docs/benchmarks.md has both figures.
// Each operation is timed next to, in the same loop, a memcpy of the same
// 6,144,000 bytes between two reused heap buffers and a memmap.Tensor.Gather
// of 5 other random rows into a reused buffer, and reports memcpy-ratio and
// rawgather-ratio (its throughput over theirs; 1.0 is as fast). The CPU
// cache is flushed (128 MiB read, untimed) before each timed copy, so that
// none of them finds its bytes left in cache by the one before. Gather
// allocates its result, which costs page faults on fresh heap memory;
// GatherInto reuses a batch, as a data loader would.
//
//	go test -run '^$' -bench TensorDict -benchtime 20x ./tensordict
func BenchmarkTensorDict(b *testing.B) {
	const rows = 1000
	prefix := filepath.Join(b.TempDir(), "seed")
	td, err := Create(prefix, []int{rows}, Field{Key: []string{"memmap"}, DType: memmap.Uint8, Shape: []int{rows, 640, 640, 3}})
	if err != nil {
		b.Fatal(err)
	}
	defer td.Close()
	all := make([]int, rows)
	for i := range all {
		all[i] = i
	}
	if err := td.Fill(all, 1); err != nil { // touch every page: warm
		b.Fatal(err)
	}
	if err := td.Flush(); err != nil { // no writeback of 1.2 GB competing with the timed loop
		b.Fatal(err)
	}
	x, _ := td.Tensor("memmap")
	rowBytes := x.RowBytes()
	src, dst := benchkit.Touched(5*rowBytes), benchkit.Touched(5*rowBytes)
	raw := benchkit.Touched(5 * rowBytes)
	rng := rand.New(rand.NewPCG(1, 1))
	r, other := make([]int, 5), make([]int, 5)
	flush := benchkit.Touched(benchkit.CacheFlushBytes) // read between timed copies
	benchkit.PickRows(rng, rows, r)
	batch, err := td.Gather(r)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		op   func(rows []int) error
	}{
		{"gatherinto-warm", func(r []int) error { return td.GatherInto(batch, r) }},
		{"gather-alloc-warm", func(r []int) error { _, err := td.Gather(r); return err }},
		{"setrows-warm", func(r []int) error { return td.SetRows(r, batch) }},
		{"fill-warm", func(r []int) error { return td.Fill(r, 1) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(5 * rowBytes))
			var opT, cpyT, rawT []time.Duration
			for b.Loop() {
				benchkit.PickRows(rng, rows, r)
				benchkit.PickRows(rng, rows, other)
				// Warm, as benchmarks/gather defines it: the same rows were
				// just moved the same way (untimed), then the CPU cache flushed.
				if err := tc.op(r); err != nil {
					b.Fatal(err)
				}
				if err := x.mm.Gather(raw, other); err != nil {
					b.Fatal(err)
				}
				benchkit.FlushCache(flush)
				t0 := time.Now()
				if err := tc.op(r); err != nil {
					b.Fatal(err)
				}
				opT = append(opT, time.Since(t0))
				benchkit.FlushCache(flush)
				t0 = time.Now()
				copy(dst, src)
				cpyT = append(cpyT, time.Since(t0))
				benchkit.FlushCache(flush)
				t0 = time.Now()
				if err := x.mm.Gather(raw, other); err != nil {
					b.Fatal(err)
				}
				rawT = append(rawT, time.Since(t0))
			}
			// Medians: one stalled copy must not decide the ratio.
			p50 := func(d []time.Duration) float64 { return float64(report.Percentile(d, 50)) }
			b.ReportMetric(p50(cpyT)/p50(opT), "memcpy-ratio")
			b.ReportMetric(p50(rawT)/p50(opT), "rawgather-ratio")
		})
	}
}
