package report

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// ms returns durations of the given whole milliseconds.
func ms(v ...int) []time.Duration {
	ds := make([]time.Duration, len(v))
	for i, x := range v {
		ds[i] = time.Duration(x) * time.Millisecond
	}
	return ds
}

// oneTo returns 1ms, 2ms, ..., n ms, shuffled deterministically.
func oneTo(n int) []time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		ds[i] = time.Duration((i*7919)%n+1) * time.Millisecond // 7919 is prime, coprime to n
	}
	return ds
}

func TestPercentile(t *testing.T) {
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
		{"two p51 is the upper", ms(9, 1), 51, 9 * time.Millisecond},
		{"unsorted p50", ms(5, 1, 4, 2, 3), 50, 3 * time.Millisecond},
		{"five p90 rounds up to the max", ms(5, 1, 4, 2, 3), 90, 5 * time.Millisecond},
		{"five p20 is exact rank 1", ms(5, 1, 4, 2, 3), 20, 1 * time.Millisecond},
		{"five p21 is rank 2", ms(5, 1, 4, 2, 3), 21, 2 * time.Millisecond},
		{"ten p50", oneTo(10), 50, 5 * time.Millisecond},
		{"ten p90", oneTo(10), 90, 9 * time.Millisecond},
		{"ten p99", oneTo(10), 99, 10 * time.Millisecond},
		{"ten p0 is min", oneTo(10), 0, 1 * time.Millisecond},
		{"ten negative p is min", oneTo(10), -5, 1 * time.Millisecond},
		{"hundred p50", oneTo(100), 50, 50 * time.Millisecond},
		{"hundred p90", oneTo(100), 90, 90 * time.Millisecond},
		{"hundred p99", oneTo(100), 99, 99 * time.Millisecond},
		{"thousand p99.9 exact rank", oneTo(1000), 99.9, 999 * time.Millisecond},
		{"thousand p29 exact rank", oneTo(1000), 29, 290 * time.Millisecond},
		{"fifty p90 is rank 45", oneTo(50), 90, 45 * time.Millisecond},
		{"fifty p99 is rank 50", oneTo(50), 99, 50 * time.Millisecond},
		{"ties", ms(2, 2, 2, 8), 75, 2 * time.Millisecond},
		{"nanoseconds", []time.Duration{3, 1, 2}, 50, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.ds)
			if got := Percentile(tc.ds, tc.p); got != tc.want {
				t.Errorf("Percentile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
			if !slices.Equal(in, tc.ds) {
				t.Error("Percentile reordered its input")
			}
		})
	}
}

func TestPercentile_PanicsOutOfRange(t *testing.T) {
	for _, p := range []float64{100.5, math.NaN(), math.Inf(1)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Percentile(p%v) did not panic", p)
				}
			}()
			Percentile(ms(1), p)
		}()
	}
}

func TestUnits(t *testing.T) {
	if got := Ms(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("Ms(1.5ms) = %v", got)
	}
	for _, tc := range []struct {
		n    int64
		d    time.Duration
		want float64
	}{
		{6_144_000, 307200 * time.Microsecond, 0.02}, // 6.144 MB in 307.2 ms
		{2e9, time.Second, 2},
		{1, 0, 0},
		{1, -time.Second, 0},
	} {
		if got := GBps(tc.n, tc.d); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("GBps(%d, %v) = %v, want %v", tc.n, tc.d, got, tc.want)
		}
	}
}

func TestTable_Layout(t *testing.T) {
	tb := NewTable("op", "n", "p50 ms", "ratio")
	tb.Row("memcpy", 50, 0.3071, 1.0)
	tb.Row("gather warm", 50, 0.33, float32(0.93))
	tb.Row("scatter cold", 5, 16.256, 0.019)
	tb.Row("anon", "", 0.5) // blanks keep a number column right-aligned
	var b strings.Builder
	n, err := tb.WriteTo(&b)
	if err != nil {
		t.Fatal(err)
	}
	want := "" +
		"op             n  p50 ms  ratio\n" +
		"------------  --  ------  -----\n" +
		"memcpy        50    0.31   1.00\n" +
		"gather warm   50    0.33   0.93\n" +
		"scatter cold   5   16.26   0.02\n" +
		"anon                0.50\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	if n != int64(len(want)) {
		t.Errorf("WriteTo returned %d, wrote %d bytes", n, len(want))
	}
}

func TestTable_MixedShortAndWideCells(t *testing.T) {
	tb := NewTable("name", "value")
	tb.Prec = 1
	tb.Row("héllo", 2.25)     // runes, not bytes, set the width
	tb.Row("x", "n/a")        // a text cell makes the column left-aligned
	tb.Row("only one column") // missing cells print as empty
	tb.Row(true, 7, "extra")  // a row wider than the header
	var b strings.Builder
	if _, err := tb.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"name             value\n" +
		"---------------  -----  -----\n" +
		"héllo            2.2\n" +
		"x                n/a\n" +
		"only one column\n" +
		"true             7      extra\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestTable_NoHeaderNoRows(t *testing.T) {
	var b strings.Builder
	if _, err := (&Table{}).WriteTo(&b); err != nil || b.Len() != 0 {
		t.Errorf("empty table wrote %q, %v", b.String(), err)
	}
	tb := NewTable("a", "bb")
	b.Reset()
	tb.WriteTo(&b)
	if want := "a  bb\n-  --\n"; b.String() != want {
		t.Errorf("header only: %q, want %q", b.String(), want)
	}
}

func TestWriteJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	v := map[string]any{"memcpy_ms_p50": 0.31, "rows": 1000}
	if err := WriteJSON(path, v); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"memcpy_ms_p50\": 0.31,\n  \"rows\": 1000\n}\n"; string(raw) != want {
		t.Errorf("file holds %q, want %q", raw, want)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode().Perm())
	}

	// A value that cannot be encoded leaves the old file as it was.
	if err := WriteJSON(path, map[string]any{"bad": make(chan int)}); err == nil {
		t.Error("encoding a channel succeeded")
	}
	var back map[string]any
	if raw, _ := os.ReadFile(path); json.Unmarshal(raw, &back) != nil || back["rows"] != 1000.0 {
		t.Errorf("old file changed after a failed write: %s", raw)
	}
	// Nor does a directory that does not exist create anything.
	if err := WriteJSON(filepath.Join(dir, "missing", "x.json"), v); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only out.json (no temp files)", len(entries))
	}
}
