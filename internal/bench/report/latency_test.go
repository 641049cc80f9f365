package report

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// near reports whether got is want to 3 significant digits, as a Latency
// keeps it.
func near(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= float64(want)/1000+1
}

func latencyOf(ds []time.Duration) *Latency {
	var l Latency
	for _, d := range ds {
		l.Record(d)
	}
	return &l
}

func TestLatency_Quantile(t *testing.T) {
	for _, tc := range []struct {
		name string
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value p0", ms(7), 0, 7 * time.Millisecond},
		{"one value p50", ms(7), 50, 7 * time.Millisecond},
		{"one value p100", ms(7), 100, 7 * time.Millisecond},
		{"two p50 is the lower", ms(9, 1), 50, 1 * time.Millisecond},
		{"unsorted p50", ms(5, 1, 4, 2, 3), 50, 3 * time.Millisecond},
		{"ten p50", oneTo(10), 50, 5 * time.Millisecond},
		{"ten p90", oneTo(10), 90, 9 * time.Millisecond},
		{"ten p99", oneTo(10), 99, 10 * time.Millisecond},
		{"ten p0 is min", oneTo(10), 0, 1 * time.Millisecond},
		{"ten negative p is min", oneTo(10), -5, 1 * time.Millisecond},
		{"ten p above 100 is max", oneTo(10), 120, 10 * time.Millisecond},
		{"thousand p99.9", oneTo(1000), 99.9, 999 * time.Millisecond},
		{"nanoseconds", []time.Duration{3, 1, 2}, 50, 2},
		{"zero counts as 1 ns", []time.Duration{0, -5}, 50, 1},
		{"beyond an hour counts as an hour", []time.Duration{2 * time.Hour}, 50, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := latencyOf(tc.ds).Quantile(tc.p); !near(got, tc.want) {
				t.Errorf("Quantile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestLatency_Stats(t *testing.T) {
	var empty Latency
	if got := empty.Stats(); got != (Stats{}) {
		t.Errorf("empty: %+v", got)
	}
	got := latencyOf(oneTo(1000)).Stats()
	want := Stats{N: 1000, Min: 1e6, P50: 500e6, P90: 900e6, P99: 990e6, P999: 999e6, Max: 1000e6, Mean: 500.5e6}
	if got.N != want.N {
		t.Errorf("N = %d, want %d", got.N, want.N)
	}
	for _, f := range []struct {
		name      string
		got, want time.Duration
	}{
		{"min", got.Min, want.Min}, {"p50", got.P50, want.P50}, {"p90", got.P90, want.P90},
		{"p99", got.P99, want.P99}, {"p99.9", got.P999, want.P999}, {"max", got.Max, want.Max},
		{"mean", got.Mean, want.Mean},
	} {
		if !near(f.got, f.want) {
			t.Errorf("%s = %v, want %v to 3 digits", f.name, f.got, f.want)
		}
	}
}

// TestLatency_MergeAcrossJSON sends two halves of a set of durations
// through JSON, as the benchmarks' child processes do, and checks that the
// merged histogram summarizes the whole set.
func TestLatency_MergeAcrossJSON(t *testing.T) {
	all := oneTo(1000)
	type report struct {
		Extend Latency `json:"extend"`
	}
	var merged Latency
	for _, half := range [][]time.Duration{all[:500], all[500:]} {
		data, err := json.Marshal(report{Extend: *latencyOf(half)})
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > 8<<10 {
			t.Errorf("a histogram of 500 values encodes in %d bytes", len(data))
		}
		var back report
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		if back.Extend.Count() != 500 {
			t.Fatalf("decoded %d values, want 500", back.Extend.Count())
		}
		merged.Merge(&back.Extend)
	}
	if got, want := merged.Stats(), latencyOf(all).Stats(); got != want {
		t.Errorf("merged: %+v\nwhole: %+v", got, want)
	}
	merged.Merge(&Latency{}) // merging an empty one changes nothing
	if merged.Count() != 1000 {
		t.Errorf("count %d after merging an empty histogram", merged.Count())
	}
}

func TestLatency_JSONEmptyAndBad(t *testing.T) {
	data, err := json.Marshal(Latency{})
	if err != nil || string(data) != `""` {
		t.Fatalf("empty Latency encodes as %s, %v", data, err)
	}
	l := *latencyOf(ms(1, 2))
	if err := json.Unmarshal(data, &l); err != nil || l.Count() != 0 {
		t.Errorf("decoding \"\" gave %d values, %v", l.Count(), err)
	}
	for _, bad := range []string{`3`, `"not base64!"`, `"AAAA"`} {
		if err := json.Unmarshal([]byte(bad), &l); err == nil {
			t.Errorf("decoding %s succeeded", bad)
		}
	}
	// A histogram of another range is refused, not misread.
	var other Latency
	other.Record(time.Second)
	enc, _ := json.Marshal(other)
	other.h = nil
	if err := json.Unmarshal(enc, &other); err != nil || other.Count() != 1 {
		t.Fatalf("round trip: %v", err)
	}
	other.h = newOtherGeometry()
	enc, _ = json.Marshal(other)
	if err := json.Unmarshal(enc, &l); err == nil || !strings.Contains(err.Error(), "digits") {
		t.Errorf("decoding a histogram of another geometry: %v", err)
	}
}

func newOtherGeometry() *hdrhistogram.Histogram {
	h := hdrhistogram.New(1, 1000, 2)
	h.RecordValue(5)
	return h
}
