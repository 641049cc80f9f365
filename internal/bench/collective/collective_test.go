package collective

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
	"github.com/tensorwire/tensorwire/internal/testkit/netns"
)

// childArg makes the test binary run the benchmark (its ranks) instead of
// the tests.
const childArg = "bench-collective-child"

func TestMain(m *testing.M) { benchtest.Main(m, Run, childArg) }

// TestResult_JSONKeys pins the keys of --json (issue 17's).
func TestResult_JSONKeys(t *testing.T) {
	b, err := json.Marshal(Result{Runs: []Line{{}}})
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Runs []map[string]any `json:"runs"`
	}
	var top map[string]any
	json.Unmarshal(b, &m)
	json.Unmarshal(b, &top)
	var keys []string
	for k := range m.Runs[0] {
		keys = append(keys, k)
	}
	want := []string{"algbw_GBps", "busbw_GBps", "bytes", "op", "p50_us", "ranks", "transport"}
	if !sameSet(keys, want) {
		t.Fatalf("run keys %v, want %v", keys, want)
	}
	if _, ok := top["memcpy_GBps"]; !ok || len(top) != 2 {
		t.Fatalf("top-level keys %v", top)
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range b {
		found := false
		for _, y := range a {
			found = found || x == y
		}
		if !found {
			return false
		}
	}
	return true
}

// TestRun_Small runs the benchmark at its smallest: two ranks as
// processes, both transports, every operation at 1 KiB.
func TestRun_Small(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	var out, errb bytes.Buffer
	jf := filepath.Join(t.TempDir(), "c.json")
	err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &errb, Self: []string{childArg}},
		[]string{"--ranks", "2", "--sizes", "1KB", "--json", jf})
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var res Result
	b, _ := os.ReadFile(jf)
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if got, want := len(res.Runs), 2*len(allOps); got != want {
		t.Fatalf("%d runs, want %d:\n%s", got, want, out.String())
	}
	for _, r := range res.Runs {
		if r.P50us <= 0 || r.BusBW <= 0 || r.Ranks != 2 || r.Bytes != 1024 {
			t.Fatalf("run %+v", r)
		}
	}
	if !strings.Contains(out.String(), "memcpy") || res.MemcpyGBps <= 0 {
		t.Fatalf("no memcpy figure:\n%s", out.String())
	}
}

func TestRun_BadFlags(t *testing.T) {
	for _, args := range [][]string{{"--ops", "allfoo"}, {"--ranks", "x"}, {"--sizes", "12QB"}, {"--transports", "udp"}, {"extra"},
		{"--hosts", "mars"}, {"--hosts", "netns", "--transports", "shm,tcp"},
		{"--transports", "hier"}, {"--hosts", "netns", "--transports", "hier"}, {"--layout", "2x2"},
		{"--hosts", "netns", "--layout", "2by2"}, {"--hosts", "netns", "--layout", "0x2"}} {
		err := Run(context.Background(), bench.Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, args)
		if !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

// TestRun_NetnsHosts runs two ranks on network-namespace hosts of their
// own (--hosts netns), over TCP between their addresses. It needs root and
// iproute2, and skips without them.
func TestRun_NetnsHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if err := netns.Available(); err != nil {
		t.Skipf("network namespaces unavailable: %v", err)
	}
	var out, errb bytes.Buffer
	jf := filepath.Join(t.TempDir(), "c.json")
	err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &errb, Self: []string{childArg}},
		[]string{"--hosts", "netns", "--ranks", "2", "--ops", "allreduce,alltoall", "--sizes", "1KB,1MB", "--json", jf})
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var res Result
	b, _ := os.ReadFile(jf)
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 4 {
		t.Fatalf("%d runs, want 4:\n%s", len(res.Runs), out.String())
	}
	for _, r := range res.Runs {
		if r.Transport != "tcp" || r.Hosts != "netns" || r.P50us <= 0 {
			t.Fatalf("run %+v, want tcp between netns hosts", r)
		}
	}
	if !strings.Contains(out.String(), "tcp/netns") {
		t.Fatalf("the table does not say tcp/netns:\n%s", out.String())
	}
}

// TestRun_NetnsLayout runs 2 hosts x 2 ranks (--layout 2x2), every rank
// over TCP and as a hierarchy, side by side. It needs root and iproute2,
// and skips without them.
func TestRun_NetnsLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if err := netns.Available(); err != nil {
		t.Skipf("network namespaces unavailable: %v", err)
	}
	var out, errb bytes.Buffer
	jf := filepath.Join(t.TempDir(), "c.json")
	err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &errb, Self: []string{childArg}},
		[]string{"--hosts", "netns", "--layout", "2x2", "--ops", "allreduce,broadcast", "--sizes", "1KB,1MB", "--json", jf})
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var res Result
	b, _ := os.ReadFile(jf)
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 8 {
		t.Fatalf("%d runs, want 8:\n%s", len(res.Runs), out.String())
	}
	for i, r := range res.Runs {
		want := "tcp"
		if i >= 4 {
			want = "hier"
		}
		if r.Transport != want || r.Hosts != "netns" || r.Layout != "2x2" || r.Ranks != 4 || r.P50us <= 0 {
			t.Fatalf("run %d %+v, want %s on 2x2 netns hosts", i, r, want)
		}
	}
	if !strings.Contains(out.String(), "hier/netns 2x2") {
		t.Fatalf("the table does not say hier/netns 2x2:\n%s", out.String())
	}
}
