package memmap_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/memmap"
)

// The benchmarks move benchBatch random rows of a uint8 tensor of shape
// benchShape (1000 images of 640x640x3: 1.2 GB), the size of a typical
// training batch read from a tensordict of images.
//
// Absolute times on shared machines are noisy, so each gather and scatter
// benchmark also times copies of the same bytes in the same loop and reports
// ratios: memcpy-ratio, the operation's throughput divided by a plain memcpy
// of cache-resident buffers, and anon-ratio, divided by the same row copies
// on anonymous memory (see benchRows). 1.0 means as fast as the reference.
// Read those, not ns/op, when comparing machines or runs. Rows picked at
// random from a dataset much larger than the CPU cache come from DRAM, so
// even plain memory cannot reach memcpy-ratio 1 when warm (about 0.6 on a
// machine whose cached memcpy is ~35 GB/s and DRAM copies ~20 GB/s);
// anon-ratio near 1 says the mapping itself costs nothing. Run them with
//
//	go test -run '^$' -bench . -benchtime 20x ./memmap.memmap
//
// warm: every page of the tensor was touched through this mapping before the
// timer started (read for Gather, written for Scatter), so the rows are in
// the page cache and in the page tables. cold: Evict runs before every
// iteration, timer stopped, so each iteration first-touches its pages and
// reads them from the disk.
var benchShape = []int{1000, 640, 640, 3}

const benchBatch = 5

// bench holds the one benchmark tensor of the process: created and filled on
// first use, closed and removed by TestMain (or on SIGINT/SIGTERM), so that
// plain `go test` never creates it.
var bench struct {
	once sync.Once
	dir  string
	t    *memmap.Tensor
	err  error
	// warm is what the current state of the mapping allows without faults:
	// 0 nothing is known to be mapped, 1 every page is mapped for reading,
	// 2 every page is mapped writable and dirty.
	warm int
}

func TestMain(m *testing.M) {
	code := m.Run()
	removeBenchTensor()
	os.Exit(code)
}

func removeBenchTensor() {
	if bench.t != nil {
		bench.t.Close()
	}
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
	if anon.buf != nil {
		benchkit.Free(anon.buf)
	}
}

// benchTensor returns the shared 1.2 GB tensor, row r filled with byte
// 1+r%251 so that every block is written (cold reads read real data, not
// unwritten extents) and flushed.
func benchTensor(b *testing.B) *memmap.Tensor {
	b.Helper()
	bench.once.Do(func() {
		// Not b.TempDir: that is removed when the first benchmark ends, and
		// the tensor is shared by all of them.
		dir, err := os.MkdirTemp("", "memmap-bench-*")
		if err != nil {
			bench.err = err
			return
		}
		bench.dir = dir
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() {
			<-sig
			os.RemoveAll(dir) // the mapping stays valid; the blocks go at exit
			fmt.Fprintln(os.Stderr, "memmap benchmarks interrupted; removed", dir)
			os.Exit(1)
		}()
		start := time.Now()
		t, err := memmap.Create(filepath.Join(dir, "bench.memmap"), memmap.Uint8, benchShape...)
		if err != nil {
			bench.err = err
			return
		}
		bench.t = t
		for r := range benchShape[0] {
			if err := t.Fill([]int{r}, []byte{byte(1 + r%251)}); err != nil {
				bench.err = err
				return
			}
		}
		if err := t.Flush(); err != nil {
			bench.err = err
			return
		}
		bench.warm = 1 // filled, flushed clean: mapped, but write-protected again
		fmt.Fprintf(os.Stderr, "memmap: created %v %d-byte benchmark tensor in %v\n",
			benchShape, t.NumBytes(), time.Since(start).Round(time.Millisecond))
	})
	if bench.err != nil {
		b.Fatalf("benchmark tensor: %v", bench.err)
	}
	return bench.t
}

// warmUp makes every page of m resident and mapped: for reading (level 1),
// or writable and dirty (level 2, by writing every row back to itself).
func warmUp(b *testing.B, m *memmap.Tensor, level int) {
	b.Helper()
	if bench.warm >= level {
		return
	}
	rs := m.RowBytes()
	buf := make([]byte, 16*rs)
	for r := 0; r < m.Len(); r += 16 {
		rows := make([]int, 0, 16)
		for i := r; i < min(r+16, m.Len()); i++ {
			rows = append(rows, i)
		}
		if err := m.Gather(buf[:len(rows)*rs], rows); err != nil {
			b.Fatal(err)
		}
		if level >= 2 {
			if err := m.Scatter(rows, buf[:len(rows)*rs]); err != nil {
				b.Fatal(err)
			}
		}
	}
	bench.warm = level
}

func BenchmarkMemcpy(b *testing.B) {
	n := benchBatch * memmap.RowBytes(memmap.Uint8, benchShape)
	src, dst := benchkit.Touched(n), benchkit.Touched(n)
	b.SetBytes(int64(n))
	for b.Loop() {
		copy(dst, src)
	}
}

func BenchmarkGather(b *testing.B) {
	for _, cold := range []bool{false, true} {
		b.Run(temp(cold), func(b *testing.B) {
			m := benchTensor(b)
			benchRows(b, m, cold, false, func(buf []byte, rows []int) error { return m.Gather(buf, rows) })
		})
	}
}

func BenchmarkScatter(b *testing.B) {
	for _, cold := range []bool{false, true} {
		b.Run(temp(cold), func(b *testing.B) {
			m := benchTensor(b)
			benchRows(b, m, cold, true, func(buf []byte, rows []int) error { return m.Scatter(rows, buf) })
		})
	}
}

func temp(cold bool) string {
	if cold {
		return "cold"
	}
	return "warm"
}

// benchRows times op (a write when write is set) on benchBatch random rows
// per iteration. In the same loop, with the benchmark timer stopped, it times
// two references moving as many bytes:
//
//   - memcpy: a copy between two warm benchBatch-row heap buffers, the same
//     ones every iteration (so they stay in the CPU cache: 12 MB);
//   - anon: the same row copies as op, but to or from random rows of an
//     anonymous (not file-backed) buffer of benchAnonRows rows, far bigger
//     than the CPU cache, like the tensor.
//
// It reports memcpy-ratio and anon-ratio (op throughput divided by the
// reference's, from the median times: the reference's median over the op's)
// and memcpy-MB/s (at its median). anon-ratio isolates
// what the file mapping costs; memcpy-ratio also includes the cost of
// reading rows from DRAM instead of the cache.
func benchRows(b *testing.B, m *memmap.Tensor, cold, write bool, op func(buf []byte, rows []int) error) {
	rs := m.RowBytes()
	n := benchBatch * rs
	buf := benchkit.Touched(n)
	csrc, cdst := benchkit.Touched(n), benchkit.Touched(n)
	anon := benchAnon(b, rs)
	rows, arows := make([]int, benchBatch), make([]int, benchBatch)
	rng := rand.New(rand.NewPCG(1, 2))
	if !cold {
		level := 1
		if write {
			level = 2
		}
		warmUp(b, m, level)
	}
	// Per-iteration times: the ratios use medians, which one stalled
	// iteration on a shared machine does not move.
	opTimes := make([]time.Duration, 0, b.N)
	memcpyTimes := make([]time.Duration, 0, b.N)
	anonTimes := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(n))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if cold {
			if err := m.Evict(); err != nil {
				b.Fatal(err)
			}
			bench.warm = 0
		}
		t0 := time.Now()
		copy(cdst, csrc)
		memcpyTimes = append(memcpyTimes, time.Since(t0))

		benchkit.PickRows(rng, len(anon)/rs, arows)
		t0 = time.Now()
		for i, r := range arows {
			if write {
				copy(anon[r*rs:(r+1)*rs], buf[i*rs:(i+1)*rs])
			} else {
				copy(buf[i*rs:(i+1)*rs], anon[r*rs:(r+1)*rs])
			}
		}
		anonTimes = append(anonTimes, time.Since(t0))
		benchkit.PickRows(rng, m.Len(), rows)
		b.StartTimer()

		t0 = time.Now()
		if err := op(buf, rows); err != nil {
			b.Fatal(err)
		}
		opTimes = append(opTimes, time.Since(t0))
	}
	b.StopTimer()
	op50 := float64(report.Percentile(opTimes, 50))
	memcpy50 := report.Percentile(memcpyTimes, 50)
	b.ReportMetric(float64(memcpy50)/op50, "memcpy-ratio")
	b.ReportMetric(float64(report.Percentile(anonTimes, 50))/op50, "anon-ratio")
	b.ReportMetric(report.GBps(int64(n), memcpy50)*1e3, "memcpy-MB/s")
}

// benchAnonRows is the number of rows of the anonymous reference buffer:
// 315 MB for the benchmark's rows, ten times a large L3 cache.
const benchAnonRows = 256

// benchAnon returns the anonymous reference buffer of benchAnonRows rows of
// rs bytes, every page touched. It is mapped outside the Go heap and
// unmapped by TestMain.
func benchAnon(b *testing.B, rs int) []byte {
	b.Helper()
	anon.once.Do(func() {
		anon.buf, anon.err = benchkit.Anon(benchAnonRows * rs)
	})
	if anon.err != nil {
		b.Fatalf("anonymous reference buffer: %v", anon.err)
	}
	return anon.buf
}

var anon struct {
	once sync.Once
	buf  []byte
	err  error
}
