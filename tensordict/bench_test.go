package tensordict

import (
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
)

// BenchmarkTensorDict measures the seed's workload through the TensorDict
// API: a memory-mapped {"memmap": uint8 [1000, 640, 640, 3]} (1.2 GB), 5
// random rows per operation, warm (every page touched first). Each
// operation is timed next to, in the same loop, a memcpy of the same
// 6,144,000 bytes between two reused heap buffers and a memmap.Tensor.Gather
// of the same rows into a reused buffer, and reports memcpy-ratio and
// rawgather-ratio (its throughput over theirs; 1.0 is as fast). Gather
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
	x, _ := td.Tensor("memmap")
	rowBytes := x.RowBytes()
	src, dst := make([]byte, 5*rowBytes), make([]byte, 5*rowBytes)
	raw := make([]byte, 5*rowBytes)
	rng := rand.New(rand.NewPCG(1, 1))
	pick := func() []int {
		r := make([]int, 5)
		for i := range r {
			r[i] = rng.IntN(rows)
		}
		return r
	}
	batch, err := td.Gather(pick())
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
			var opT, cpyT, rawT time.Duration
			for b.Loop() {
				r := pick()
				t0 := time.Now()
				if err := tc.op(r); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				copy(dst, src)
				t2 := time.Now()
				if err := x.mm.Gather(raw, r); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				opT, cpyT, rawT = opT+t1.Sub(t0), cpyT+t2.Sub(t1), rawT+t3.Sub(t2)
			}
			b.ReportMetric(float64(cpyT)/float64(opT), "memcpy-ratio")
			b.ReportMetric(float64(rawT)/float64(opT), "rawgather-ratio")
		})
	}
}
