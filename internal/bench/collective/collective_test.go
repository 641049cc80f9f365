package collective

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
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
	// The columns of issue 29, where they apply.
	b, _ = json.Marshal(Result{Runs: []Line{{Bound: 1, OfBound: 1, VsGloo: 1, VsMPI: 1}}, MemBW: []MemBW{{2, 1}}, Notes: []string{"n"}})
	m.Runs, top = nil, nil
	json.Unmarshal(b, &m)
	json.Unmarshal(b, &top)
	keys = keys[:0]
	for k := range m.Runs[0] {
		keys = append(keys, k)
	}
	if want := append(want, "bound_GBps", "busbw_of_bound", "gloo_p50_over_p50", "openmpi_p50_over_p50"); !sameSet(keys, want) {
		t.Fatalf("run keys %v, want %v", keys, want)
	}
	for _, k := range []string{"memcpy_GBps", "membw", "notes", "runs"} {
		if _, ok := top[k]; !ok || len(top) != 4 {
			t.Fatalf("top-level keys %v", top)
		}
	}
	// The machine's wake-up round trip, where it was measured.
	b, _ = json.Marshal(Result{Wake: &benchkit.Wake{Across: 65300 * time.Nanosecond, Same: 7600 * time.Nanosecond}})
	var w struct {
		Wake map[string]float64 `json:"wake_round_trip"`
	}
	json.Unmarshal(b, &w)
	if want := map[string]float64{"across_us": 65.3, "same_us": 7.6}; !maps.Equal(w.Wake, want) {
		t.Fatalf("wake_round_trip %v, want %v (%s)", w.Wake, want, b)
	}
	// The loopback cost and the cores, the tcp lines' bound.
	b, _ = json.Marshal(Result{Loopback: &benchkit.Loopback{GBps: 1.5, CPUNsPerByte: 0.4}, Cores: 2})
	var l struct {
		Loopback map[string]float64 `json:"loopback"`
		Cores    int                `json:"cores"`
	}
	json.Unmarshal(b, &l)
	if want := map[string]float64{"GBps": 1.5, "cpu_ns_per_byte": 0.4}; !maps.Equal(l.Loopback, want) || l.Cores != 2 {
		t.Fatalf("loopback %v on %d cores, want %v on 2 (%s)", l.Loopback, l.Cores, want, b)
	}
}

// runJSON runs the benchmark with args (its ranks processes of this test
// binary) and returns what it wrote to --json, and its table.
func runJSON(t *testing.T, args ...string) (Result, string) {
	t.Helper()
	var out, errb bytes.Buffer
	jf := filepath.Join(t.TempDir(), "c.json")
	err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &errb, Self: []string{childArg}},
		append(args, "--json", jf))
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var res Result
	b, _ := os.ReadFile(jf)
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return res, out.String()
}

// needNetns skips t where network-namespace hosts cannot be made (root
// and iproute2), or under -short.
func needNetns(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes")
	}
	if err := netns.Available(); err != nil {
		t.Skipf("network namespaces unavailable: %v", err)
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
// processes, every transport of one host (shm-alloc: the tensors from
// Comm.Alloc), every operation at 1 KiB.
func TestRun_Small(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	res, out := runJSON(t, "--ranks", "2", "--sizes", "1KB", "--transports", "shm,shm-alloc,tcp", "--gloo", "off", "--mpi", "off")
	if got, want := len(res.Runs), 3*len(allOps); got != want {
		t.Fatalf("%d runs, want %d:\n%s", got, want, out)
	}
	for _, r := range res.Runs {
		if r.P50us <= 0 || r.BusBW <= 0 || r.Ranks != 2 || r.Bytes != 1024 {
			t.Fatalf("run %+v", r)
		}
	}
	if !strings.Contains(out, "memcpy") || res.MemcpyGBps <= 0 {
		t.Fatalf("no memcpy figure:\n%s", out)
	}
	// The bound of the shm allreduce lines, from B measured in this run.
	if len(res.MemBW) != 1 || res.MemBW[0].Procs != 2 || res.MemBW[0].GBps <= 0 {
		t.Fatalf("memory bandwidth %+v, want one figure for 2 processes", res.MemBW)
	}
	// And of the tcp ones, from the loopback cost measured in this run:
	// min(p, cores)/(p·c) for p = 2.
	if res.Loopback == nil || res.Loopback.CPUNsPerByte <= 0 || res.Cores <= 0 {
		t.Fatalf("loopback cost %+v on %d cores: not measured", res.Loopback, res.Cores)
	}
	tcpBound := float64(min(2, res.Cores)) / (2 * res.Loopback.CPUNsPerByte)
	for _, r := range res.Runs {
		// One Allreduce's bound; forward+backward runs two in its time.
		var want float64
		switch {
		case r.Op != "allreduce" && r.Op != "allreduce-fwd-bwd":
		case r.Transport == "shm" || r.Transport == "shm-alloc":
			want = res.MemBW[0].GBps // 2B/p, p = 2
		case r.Transport == "tcp":
			want = tcpBound
		}
		if r.Op == "allreduce-fwd-bwd" {
			want /= 2
		}
		if math.Abs(r.Bound-want) > 1e-9*want || (want > 0 && math.Abs(r.OfBound-r.BusBW/r.Bound) > 1e-12) {
			t.Fatalf("run %+v: bound %v, want %v and busbw over it", r, r.Bound, want)
		}
	}
	if !strings.Contains(out, "busbw / bound") || !strings.Contains(out, "2 processes") || !strings.Contains(out, "loopback TCP") {
		t.Fatalf("no bound in the table:\n%s", out)
	}
}

// TestFigures_GlooBeside: each line gets gloo's p50 over its own for the
// same operation, rank count and size (whatever the transport), and only
// then.
// TestRun_SendRecv runs the sendrecv ping-pong on 3 ranks (rank 2 has no
// partner) by reference, inline and over TCP: a line each, its busbw
// twice its algbw.
func TestRun_SendRecv(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	res, out := runJSON(t, "--ops", "sendrecv", "--ranks", "3", "--sizes", "64KB", "--transports", "shm,shm-inline,tcp", "--gloo", "off")
	if len(res.Runs) != 3 {
		t.Fatalf("%d runs, want 3:\n%s", len(res.Runs), out)
	}
	for i, r := range res.Runs {
		if r.Op != "sendrecv" || r.Transport != []string{"shm", "shm-inline", "tcp"}[i] || r.P50us <= 0 || r.BusBW != 2*r.AlgBW {
			t.Errorf("run %+v", r)
		}
	}
}

func TestFigures_GlooBeside(t *testing.T) {
	res := Result{Runs: []Line{
		{Op: "allreduce", Ranks: 4, Bytes: 1 << 20, Transport: "tcp", P50us: 100},
		{Op: "allreduce", Ranks: 4, Bytes: 1 << 20, Transport: "shm", P50us: 50},
		{Op: "allreduce", Ranks: 2, Bytes: 1 << 20, Transport: "tcp", P50us: 100},
		{Op: "allgather", Ranks: 4, Bytes: 1 << 20, Transport: "tcp", P50us: 100},
	}}
	gloo := []Line{{Op: "allreduce", Ranks: 4, Bytes: 1 << 20, Transport: "tcp", System: "gloo", P50us: 150, BusBW: 0.5}}
	res.Loopback, res.Cores = &benchkit.Loopback{CPUNsPerByte: 0.5}, 2
	figures(&res, gloo, []Line{{Op: "allreduce", Ranks: 2, Bytes: 1 << 20, Transport: "mpi", System: "openmpi", P50us: 80}})
	// gloo's line gets the loopback bound ours over TCP gets: min(4, 2
	// cores)/(4·0.5 ns) = 1 GB/s.
	if g := gloo[0]; g.Bound != 1 || g.OfBound != 0.5 || res.Runs[0].Bound != 1 {
		t.Fatalf("gloo %+v, ours %+v: the loopback bound is 1 GB/s", g, res.Runs[0])
	}
	for i, want := range []float64{1.5, 3, 0, 0} {
		if got := res.Runs[i].VsGloo; got != want {
			t.Fatalf("line %d: gloo p50 / p50 %v, want %v", i, got, want)
		}
	}
	for i, want := range []float64{0, 0, 0.8, 0} {
		if got := res.Runs[i].VsMPI; got != want {
			t.Fatalf("line %d: openmpi p50 / p50 %v, want %v", i, got, want)
		}
	}
}

// TestRun_OpenMPIBeside: with mpicc and mpirun at hand (Debian's
// openmpi-bin and libopenmpi-dev), --mpi auto builds the C program and
// puts Open MPI's allreduce lines beside ours, each of ours with its
// ratio; it skips without them.
func TestRun_OpenMPIBeside(t *testing.T) {
	if _, err := exec.LookPath("mpicc"); err != nil {
		t.Skip("no mpicc on PATH (Debian: libopenmpi-dev)")
	}
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Skip("no mpirun on PATH (Debian: openmpi-bin)")
	}
	var out, log bytes.Buffer
	j := filepath.Join(t.TempDir(), "out.json")
	err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &log, Self: []string{childArg}},
		[]string{"--ops", "allreduce", "--ranks", "2", "--sizes", "64KB", "--transports", "tcp", "--gloo", "off", "--json", j})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	var res Result
	if err := json.Unmarshal(must(os.ReadFile(j)), &res); err != nil {
		t.Fatal(err)
	}
	var mpi, ours *Line
	for i, r := range res.Runs {
		switch r.System {
		case "openmpi":
			mpi = &res.Runs[i]
		case "":
			ours = &res.Runs[i]
		}
	}
	if mpi == nil || ours == nil || mpi.P50us <= 0 || mpi.Bytes != 64<<10 || ours.VsMPI != mpi.P50us/ours.P50us {
		t.Fatalf("lines %+v\n%s", res.Runs, log.String())
	}
	if !strings.Contains(out.String(), "openmpi p50 / p50") {
		t.Fatalf("table without the openmpi column:\n%s", out.String())
	}
}

func TestRun_BadFlags(t *testing.T) {
	for _, args := range [][]string{{"--ops", "allfoo"}, {"--mpi", "maybe"}, {"--ranks", "x"}, {"--sizes", "12QB"}, {"--transports", "udp"}, {"extra"},
		{"--hosts", "mars"}, {"--hosts", "netns", "--transports", "shm,tcp"}, {"--hosts", "netns", "--transports", "shm-inline"},
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
	needNetns(t)
	res, out := runJSON(t, "--hosts", "netns", "--ranks", "2", "--ops", "allreduce,alltoall", "--sizes", "1KB,1MB", "--gloo", "off")
	if len(res.Runs) != 4 {
		t.Fatalf("%d runs, want 4:\n%s", len(res.Runs), out)
	}
	for _, r := range res.Runs {
		if r.Transport != "tcp" || r.Hosts != "netns" || r.P50us <= 0 {
			t.Fatalf("run %+v, want tcp between netns hosts", r)
		}
	}
	if !strings.Contains(out, "tcp/netns") {
		t.Fatalf("the table does not say tcp/netns:\n%s", out)
	}
}

// TestRun_NetnsLayout runs 2 hosts x 2 ranks (--layout 2x2), every rank
// over TCP and as a hierarchy, side by side. It needs root and iproute2,
// and skips without them.
func TestRun_NetnsLayout(t *testing.T) {
	needNetns(t)
	res, out := runJSON(t, "--hosts", "netns", "--layout", "2x2", "--ops", "allreduce,broadcast", "--sizes", "1KB,1MB")
	if len(res.Runs) != 8 {
		t.Fatalf("%d runs, want 8:\n%s", len(res.Runs), out)
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
	if !strings.Contains(out, "hier/netns 2x2") {
		t.Fatalf("the table does not say hier/netns 2x2:\n%s", out)
	}
}
