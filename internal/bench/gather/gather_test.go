package gather

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
)

// jsonKeys are the keys of the --json file, as the benchmark wrote them
// before its results became a typed struct (go run ./benchmarks/gather
// --json, 2026-11-24). docs/benchmarks.md and scripts read them: they keep
// their names.
var jsonKeys = []string{
	"anon_gather_gbps", "anon_gather_ms_p50", "anon_gather_ms_p90", "anon_gather_ratio", "anon_rows",
	"anon_scatter_gbps", "anon_scatter_ms_p50", "anon_scatter_ms_p90", "anon_scatter_ratio", "batch_bytes",
	"batch_rows", "dataset_bytes", "fill_seconds", "flush_seconds", "gather_cold_anon_ratio", "gather_cold_gbps",
	"gather_cold_ms_p50", "gather_cold_ms_p90", "gather_cold_ratio", "gather_warm_anon_ratio", "gather_warm_gbps",
	"gather_warm_ms_p50", "gather_warm_ms_p90", "gather_warm_ratio", "iters", "memcpy_gbps", "memcpy_ms_p50",
	"memcpy_ms_p90", "row_bytes", "rows", "scatter_cold_anon_ratio", "scatter_cold_gbps", "scatter_cold_ms_p50",
	"scatter_cold_ms_p90", "scatter_cold_ratio", "scatter_warm_anon_ratio", "scatter_warm_gbps",
	"scatter_warm_ms_p50", "scatter_warm_ms_p90", "scatter_warm_ratio", "seed", "stream_batch_bytes",
	"stream_batch_rows", "stream_cold_gbps", "stream_heap_inuse_peak_bytes", "stream_warm_gbps", "verified",
}

// TestRun_JSONKeys runs the benchmark on a small dataset and checks its
// table and that its JSON has exactly the keys it always had.
func TestRun_JSONKeys(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "gather.json")
	out := benchtest.RunJSON(t, Run, nil,
		[]string{"--rows", "8", "--iters", "2", "--dir", dir, "--json", jsonFile}, jsonFile)
	for _, s := range []string{"gather warm", "scatter cold", "vs memcpy", "peak Go heap MB", "verified: every gathered"} {
		if !strings.Contains(out.Stdout, s) {
			t.Errorf("the table lacks %q:\n%s", s, out.Stdout)
		}
	}
	if keys := slices.Sorted(maps.Keys(out.JSON)); !slices.Equal(keys, jsonKeys) {
		t.Errorf("JSON keys\n%q\nwant\n%q", keys, jsonKeys)
	}
	if out.JSON["rows"] != 8.0 || out.JSON["verified"] != true || out.JSON["memcpy_ms_p50"].(float64) <= 0 {
		t.Errorf("JSON %s", out.Data)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d entries left in --dir, want only the JSON file", len(entries))
	}
}

func TestRun_Usage(t *testing.T) {
	for _, args := range [][]string{{"--rows", "4"}, {"--iters", "0"}, {"--nope"}, {"extra"}} {
		var out bytes.Buffer
		if err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &out}, args); !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
