// Package report holds the small pieces every tensorwire benchmark program
// shares: latency histograms that merge across goroutines and processes
// (Latency), exact percentiles of a few durations (Percentile), unit
// conversions, an aligned text table, and an atomic JSON writer for
// machine-readable results.
//
// Benchmarks on shared, noisy machines should compare operations measured
// side by side in the same run (a ratio), never absolute times across runs;
// this package only summarizes and prints what the programs measure.
package report

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
)

// Percentile returns the p-th percentile (0 <= p <= 100) of ds by the
// nearest-rank method: after sorting ascending, the value at 1-based rank
// ceil(p/100 * n), clamped to [1, n]. It is always one of the measured
// values, never an interpolation: for n = 10, p50 is the 5th smallest value,
// p90 the 9th and p99 the 10th (the largest). p <= 0 gives the smallest
// value. An empty ds gives 0. ds is not modified.
//
// Percentile sorts a copy of ds on every call: it is for the few durations
// of a testing.B loop. Benchmarks that time many operations, or time them
// in several goroutines or processes, record them in a Latency.
//
// Percentile panics if p is NaN or greater than 100.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if math.IsNaN(p) || p > 100 {
		panic(fmt.Sprintf("report: percentile %v not in [0, 100]", p))
	}
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[rank(len(s), p)-1]
}

// rank returns the nearest rank, 1-based, of percentile p among n sorted
// values. The product is formed before the division so that integral p and n
// give an exact rank; the small tolerance absorbs rounding of non-integral p
// (99.9 is not exact in binary) that would otherwise push an exact rank up.
func rank(n int, p float64) int {
	r := int(math.Ceil(p*float64(n)/100 - 1e-9))
	return min(max(r, 1), n)
}

// Stats summarizes a set of durations; see Latency.Stats.
type Stats struct {
	N    int           `json:"n"`
	Min  time.Duration `json:"min_ns"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
}

// Ms returns d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// GBps returns the throughput of moving n bytes in d, in decimal gigabytes
// (1e9 bytes) per second. It returns 0 if d <= 0.
func GBps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e9
}

// WriteJSON writes v as indented JSON (two spaces, trailing newline) to path,
// with mode 0644, atomically (atomicfile.WriteFile): readers see either the
// old file or the whole new one, and a value that does not encode, or a
// failed write, leaves no temporary file and an existing path unchanged.
func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		err = atomicfile.WriteFile(path, append(data, '\n'), 0o644)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
