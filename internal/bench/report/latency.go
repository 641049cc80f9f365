package report

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// The range and precision of a Latency: from 1 ns to an hour, with 3
// significant decimal digits (a recorded value is known to within 0.1%).
const (
	latencyLowest  = 1
	latencyHighest = int64(time.Hour)
	latencyDigits  = 3
)

// Latency is a histogram of durations (github.com/HdrHistogram/hdrhistogram-go):
// Record is O(1) and its memory is fixed (about 260 KB), however many
// durations it counts, and histograms merge (Merge) across goroutines and
// processes, which send them as JSON. Quantiles are exact to 3 significant
// digits.
//
// The zero Latency is empty and ready to use. A Latency is not safe for
// concurrent use: give each goroutine its own and merge them.
//
// Its JSON is a string: the HdrHistogram V2 compressed encoding (base64),
// which any HdrHistogram library reads, of the durations in nanoseconds; an
// empty Latency encodes as "".
type Latency struct {
	h *hdrhistogram.Histogram // nil while empty
}

func (l *Latency) init() {
	if l.h == nil {
		l.h = hdrhistogram.New(latencyLowest, latencyHighest, latencyDigits)
	}
}

// Record counts d. Durations below 1 ns count as 1 ns and durations above an
// hour as an hour.
func (l *Latency) Record(d time.Duration) {
	l.init()
	// In range after the clamp, so RecordValue cannot fail.
	_ = l.h.RecordValue(min(max(int64(d), latencyLowest), latencyHighest))
}

// Merge adds every duration o counted to l. o is not modified.
func (l *Latency) Merge(o *Latency) {
	if o.h == nil {
		return
	}
	l.init()
	l.h.Merge(o.h) // same range: nothing is dropped
}

// Count returns how many durations were recorded.
func (l *Latency) Count() int64 {
	if l.h == nil {
		return 0
	}
	return l.h.TotalCount()
}

// Quantile returns the p-th percentile (0 <= p <= 100) of the durations, as
// HdrHistogram defines it: the recorded value of rank round(p/100 * n)
// among the n values sorted ascending (rank 1 at least), to 3 significant
// digits (the highest value of its histogram bucket). For n = 10, p50 is the 5th smallest value, p90
// the 9th and p99 the 10th (the largest). p <= 0 gives the smallest value
// and p >= 100 the largest. An empty Latency gives 0.
func (l *Latency) Quantile(p float64) time.Duration {
	if l.h == nil {
		return 0
	}
	if p <= 0 {
		return time.Duration(l.h.Min())
	}
	return time.Duration(l.h.ValueAtQuantile(p))
}

// Stats returns the count, extremes, mean and the p50, p90, p99 and p99.9 of
// the durations (see Quantile); an empty Latency gives the zero Stats.
func (l *Latency) Stats() Stats {
	if l.h == nil {
		return Stats{}
	}
	q := l.h.ValueAtPercentiles([]float64{50, 90, 99, 99.9})
	return Stats{
		N:    int(l.h.TotalCount()),
		Min:  time.Duration(l.h.Min()),
		P50:  time.Duration(q[50]),
		P90:  time.Duration(q[90]),
		P99:  time.Duration(q[99]),
		P999: time.Duration(q[99.9]),
		Max:  time.Duration(l.h.Max()),
		Mean: time.Duration(l.h.Mean()),
	}
}

// MarshalJSON encodes l as a JSON string: its HdrHistogram V2 compressed
// encoding, or "" if l is empty.
func (l Latency) MarshalJSON() ([]byte, error) {
	if l.h == nil {
		return []byte(`""`), nil
	}
	b, err := l.h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	if err != nil {
		return nil, fmt.Errorf("encoding a latency histogram: %w", err)
	}
	return json.Marshal(string(b))
}

// UnmarshalJSON decodes what MarshalJSON encoded. It refuses a histogram of
// another range or precision than a Latency's.
func (l *Latency) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("a latency histogram: %w", err)
	}
	l.h = nil
	if s == "" {
		return nil
	}
	h, err := hdrhistogram.Decode([]byte(s))
	if err != nil {
		return fmt.Errorf("decoding a latency histogram: %w", err)
	}
	if lo, hi, d := h.LowestTrackableValue(), h.HighestTrackableValue(), h.SignificantFigures(); lo != latencyLowest ||
		hi != latencyHighest || d != latencyDigits {
		return fmt.Errorf("a latency histogram of %d to %d at %d digits, want %d to %d at %d",
			lo, hi, d, latencyLowest, latencyHighest, latencyDigits)
	}
	l.h = h
	return nil
}
