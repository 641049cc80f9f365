package fill

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
)

// TestMain lets Run re-execute the test binary as node B: bench.Env.Self is
// empty in these tests, so node B's arguments start with --node-b.
func TestMain(m *testing.M) { benchtest.MainFlag(m, Run, "--node-b") }

// jsonKeys are the keys of the --json file, as the benchmark wrote them
// before its results became a typed struct (go run ./benchmarks/fill
// --json, 2026-11-24), and wake_round_trip (2026-12-02; Linux: elsewhere it
// is left out). docs/benchmarks.md and scripts read them: they keep their
// names.
var jsonKeys = []string{
	"batch_bytes", "batch_rows", "bytes_fill_cold_ms_p50", "bytes_fill_cold_ms_p90", "bytes_fill_hot_ms_p50",
	"bytes_fill_hot_ms_p90", "bytes_fill_warm_ms_p50", "bytes_fill_warm_ms_p90", "cold_resident_pages_max",
	"dataset_bytes", "flush_seconds", "iters", "local_fill_cold_ms_p50", "local_fill_cold_ms_p90",
	"local_fill_hot_ms_p50", "local_fill_hot_ms_p90", "local_fill_vs_seed", "local_fill_warm_ms_p50",
	"local_fill_warm_ms_p90", "null_call_hot_ms_p50", "null_call_hot_ms_p90", "null_call_warm_ms_p50",
	"null_call_warm_ms_p90", "remote_fill_cold_ms_p50", "remote_fill_cold_ms_p90", "remote_fill_hot_ms_p50",
	"remote_fill_hot_ms_p90", "remote_fill_vs_seed", "remote_fill_warm_ms_p50", "remote_fill_warm_ms_p90",
	"remote_minus_local_hot_ms_p50", "remote_minus_local_warm_ms_p50", "remote_read_cold_ms_p50",
	"remote_read_cold_ms_p90", "remote_read_hot_ms_p50", "remote_read_hot_ms_p90", "remote_read_warm_ms_p50",
	"remote_read_warm_ms_p90", "rows", "seed_local_fill_ms_p50", "seed_remote_fill_ms_p50", "shared_fs", "verified",
	"wake_round_trip", "write_seconds",
}

// TestRun_JSONKeys runs the benchmark on a small dataset, node B a child
// process, and checks its report and that its JSON has exactly the keys it
// always had, with the machine's wake-up round trip beside them.
func TestRun_JSONKeys(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "fill.json")
	out := benchtest.RunJSON(t, Run, nil,
		[]string{"--rows", "10", "--iters", "2", "--dir", dir, "--json", jsonFile}, jsonFile)
	for _, s := range []string{"remote_fill", "null_call", "remote - local", "vs seed", "cold pages", "verified", "wake-up"} {
		if !strings.Contains(out.Stdout, s) {
			t.Errorf("the report lacks %q:\n%s", s, out.Stdout)
		}
	}
	want := jsonKeys
	if runtime.GOOS != "linux" {
		want = slices.DeleteFunc(slices.Clone(want), func(k string) bool { return k == "wake_round_trip" })
	}
	if keys := slices.Sorted(maps.Keys(out.JSON)); !slices.Equal(keys, want) {
		t.Errorf("JSON keys\n%q\nwant\n%q", keys, want)
	}
	if out.JSON["rows"] != 10.0 || out.JSON["verified"] != true || out.JSON["remote_fill_warm_ms_p50"].(float64) <= 0 {
		t.Errorf("JSON %s", out.Data)
	}
	if w, ok := out.JSON["wake_round_trip"].(map[string]any); runtime.GOOS == "linux" && (!ok || w["same_us"].(float64) <= 0) {
		t.Errorf("wake_round_trip %v: want the machine's round trip on one CPU, above 0 us", out.JSON["wake_round_trip"])
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d entries left in --dir, want only the JSON file", len(entries))
	}
}

func TestRun_Usage(t *testing.T) {
	for _, args := range [][]string{{"--rows", "9"}, {"--iters", "0"}, {"--nope"}, {"extra"}} {
		var out bytes.Buffer
		if err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &out}, args); !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	if err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &out}, []string{"-h"}); !strings.Contains(out.String(), "--iters") ||
		strings.Contains(out.String(), "node-b") {
		t.Errorf("-h: %v\n%s", err, out.String())
	}
}
