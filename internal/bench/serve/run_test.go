package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
	"github.com/tensorwire/tensorwire/tensordict"
)

// testSelf are the arguments with which Run re-executes the test binary
// for a role (bench.Env.Self), as cmd/tensorwire does.
var testSelf = []string{"bench", "serve"}

func testEnv(stdout, stderr io.Writer) bench.Env {
	return bench.Env{Stdout: stdout, Stderr: stderr, Self: testSelf}
}

// TestMain lets Run re-execute the test binary for a role: "bench serve
// ARGS" runs Run(ARGS), as cmd/tensorwire does.
func TestMain(m *testing.M) { benchtest.Main(m, Run, testSelf...) }

// runKeys are the keys of each entry of "runs" in the --json file, as
// issue 15 gives them: scripts and docs read them by these names.
var runKeys = []string{"batching", "clients", "max_batch", "mean_batch", "model", "p50_ms", "p99_ms", "requests_per_s"}

// TestRun_Short runs the benchmark briefly with both models, two client
// counts and a weight-update run, and checks its JSON.
func TestRun_Short(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes")
	}
	out := filepath.Join(t.TempDir(), "serve.json")
	root := t.TempDir()
	run := benchtest.RunJSON(t, Run, testSelf, []string{"--clients", "1,2", "--model", "mlp,fake",
		"--duration", "300ms", "--limit-duration", "100ms", "--update-mb", "1", "--update-every", "50ms",
		"--root", root, "--json", out}, out)
	t.Logf("stdout:\n%s", run.Stdout)
	data := run.Data
	var raw struct {
		Runs          []map[string]any   `json:"runs"`
		LimitRowsPerS map[string]float64 `json:"limit_rows_per_s"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw.Runs) != 8 {
		t.Fatalf("%d runs, want 8 (2 models, 2 client counts, batching on and off)", len(raw.Runs))
	}
	for _, r := range raw.Runs {
		var keys []string
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, runKeys) {
			t.Errorf("a run's keys %v, want %v", keys, runKeys)
		}
		if r["requests_per_s"].(float64) <= 0 || r["mean_batch"].(float64) < 1 {
			t.Errorf("run %v", r)
		}
		if mb := r["max_batch"].(float64); (mb > 1) != r["batching"].(bool) {
			t.Errorf("run %v: batching and max_batch disagree", r)
		}
	}
	for _, m := range []string{"mlp", "fake"} {
		if raw.LimitRowsPerS[m] <= 0 {
			t.Errorf("limit_rows_per_s[%s] = %v", m, raw.LimitRowsPerS[m])
		}
	}
	var res Result
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if u := res.WeightUpdate; u == nil || u.Loaded == 0 || u.ParamsMiB != 1 {
		t.Errorf("weight update %+v: want versions loaded", u)
	}
	if w := res.Wake; runtime.GOOS == "linux" && (w == nil || w.Same <= 0) {
		t.Errorf("wake_round_trip %+v: want the machine's round trip on one CPU, above 0", w)
	}
	for _, want := range []string{"limit mlp:", "requests/s", "batch sizes", "wake-up"} {
		if !strings.Contains(run.Stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	// Nothing left behind under the root.
	if left, _ := os.ReadDir(root); len(left) != 0 {
		t.Errorf("left under the root: %v", left)
	}
}

// TestRun_MaxDelay: --max-delay reaches the node. With 2 clients the
// fake model's batches of 16 never fill, so every batch waits the whole
// 20 ms: at most 2 requests per 21 ms (about 95 a second), where greedy
// batching does one per millisecond or two.
func TestRun_MaxDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	out := filepath.Join(t.TempDir(), "serve.json")
	benchtest.RunJSON(t, Run, testSelf, []string{"--clients", "2", "--model", "fake", "--max-delay", "20ms",
		"--duration", "400ms", "--limit-duration", "100ms", "--update-mb", "0", "--root", t.TempDir(), "--json", out}, out)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Config Config           `json:"config"`
		Runs   []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if res.Config.Policy != "max_delay=20ms" {
		t.Errorf("config's policy %q, want max_delay=20ms", res.Config.Policy)
	}
	for _, r := range res.Runs {
		if r["max_batch"].(float64) > 1 && r["requests_per_s"].(float64) > 150 {
			t.Errorf("a batching run at max delay 20ms did %.0f requests/s with 2 clients; want at most about 95", r["requests_per_s"])
		}
	}
}

// TestRun_Profile: --profile leaves a CPU profile (pprof's gzipped
// format) of the node and of the first client of each run.
func TestRun_Profile(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "serve.json")
	benchtest.RunJSON(t, Run, testSelf, []string{"--clients", "1", "--model", "mlp",
		"--duration", "200ms", "--limit-duration", "50ms", "--update-mb", "0",
		"--root", t.TempDir(), "--json", out, "--profile", filepath.Join(dir, "p")}, out)
	for _, name := range []string{"p-mlp-1-16-node.pprof", "p-mlp-1-16-client.pprof", "p-mlp-1-1-node.pprof", "p-mlp-1-1-client.pprof"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s: %d bytes, not a gzipped profile", name, len(b))
		}
	}
}

func TestRun_Usage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--clients", "0"}, "--clients"},
		{[]string{"--clients", "8,8"}, "given twice"},
		{[]string{"--model", "gpt"}, `unknown model "gpt"`},
		{[]string{"--max-batch", "0"}, "--max-batch"},
		{[]string{"--duration", "0s"}, "--duration"},
		{[]string{"--mode", "carrier-pigeon"}, "--mode"},
		{[]string{"--replica", "rust"}, "--replica"},
		{[]string{"--device", "tpu"}, "--device"},
		{[]string{"--window", "5"}, "--window"},
		{[]string{"--window", "0"}, "--window"},
		{[]string{"--max-delay", "-1ms"}, "--max-delay"},
		{[]string{"--client-lang", "rust"}, "--client-lang"},
		{[]string{"--in-flight", "0"}, "--in-flight"},
		{[]string{"--in-flight", "257"}, "--in-flight"},
		{[]string{"--role", "client"}, "--addr"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := Run(context.Background(), testEnv(io.Discard, io.Discard), tc.args)
		if !errors.Is(err, bench.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a usage error about %q", tc.args, err, tc.want)
		}
	}
	var out bytes.Buffer
	if err := Run(context.Background(), testEnv(&out, io.Discard), []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	for _, h := range hidden {
		if strings.Contains(out.String(), "--"+h+" ") || strings.Contains(out.String(), "--"+h+"\n") {
			t.Errorf("usage shows the hidden flag --%s", h)
		}
	}
}

// testPython returns the first of $TENSORWIRE_PYTHON, /usr/bin/python3
// and python3 that imports torch, numpy and msgpack, or skips t, saying
// that what is not tested.
func testPython(t *testing.T, what string) string {
	t.Helper()
	for _, c := range []string{os.Getenv("TENSORWIRE_PYTHON"), "/usr/bin/python3", "python3"} {
		if c != "" && exec.Command(c, "-c", "import torch, numpy, msgpack").Run() == nil {
			return c
		}
	}
	t.Skipf("no python3 with torch, numpy and msgpack ($TENSORWIRE_PYTHON, /usr/bin/python3, python3): %s not tested", what)
	return ""
}

// TestRun_PythonClients runs --client-lang python briefly, by reference
// and by bytes: Python client processes (tensorwire.serve.Client) predict
// against the Go MLP, and their requests and latencies reach the table.
// It needs a python3 with numpy and msgpack.
func TestRun_PythonClients(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Python processes")
	}
	py := testPython(t, "the Python clients' run")
	for _, mode := range []string{modeRef, modeBytes} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "serve.json")
			root := t.TempDir()
			run := benchtest.RunJSON(t, Run, testSelf, []string{"--client-lang", "python", "--model", "mlp", "--clients", "2",
				"--mode", mode, "--python", py, "--duration", "300ms", "--limit-duration", "100ms", "--update-mb", "0",
				"--root", root, "--json", out}, out)
			t.Logf("stdout:\n%s", run.Stdout)
			var res Result
			if err := json.Unmarshal(run.Data, &res); err != nil {
				t.Fatal(err)
			}
			if res.Config.ClientLang != "python" || len(res.Runs) != 2 {
				t.Fatalf("client_lang %q, %d runs; want python, 2", res.Config.ClientLang, len(res.Runs))
			}
			for _, r := range res.Runs {
				if r.RequestsPerS <= 0 || r.P50 <= 0 || r.P99 < r.P50 {
					t.Errorf("run %+v: want requests and their latencies", r)
				}
			}
			if !strings.Contains(run.Stdout, "Python clients") {
				t.Errorf("the table's header does not say the clients are Python's")
			}
			if left, _ := os.ReadDir(root); len(left) != 0 {
				t.Errorf("left under the root: %v", left)
			}
		})
	}
}

// TestRun_InFlight runs one client process with 8 predictions in flight,
// Go's (goroutines) and Python's (asyncio tasks), under a max delay of
// 20 ms: the batches hold several of its rows, which a client with one
// in flight cannot make.
func TestRun_InFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, lang := range []string{"go", "python"} {
		t.Run(lang, func(t *testing.T) {
			args := []string{"--client-lang", lang, "--model", "mlp", "--clients", "1", "--in-flight", "8", "--max-delay", "20ms",
				"--duration", "400ms", "--limit-duration", "100ms", "--update-mb", "0", "--root", t.TempDir()}
			if lang == "python" {
				args = append(args, "--python", testPython(t, "the Python clients' run"))
			}
			out := filepath.Join(t.TempDir(), "serve.json")
			run := benchtest.RunJSON(t, Run, testSelf, append(args, "--json", out), out)
			t.Logf("stdout:\n%s", run.Stdout)
			var res Result
			if err := json.Unmarshal(run.Data, &res); err != nil {
				t.Fatal(err)
			}
			if res.Config.InFlight != 8 || !strings.Contains(run.Stdout, "8 predictions in flight each") {
				t.Errorf("in_flight %d; want 8, in the JSON and the table's header", res.Config.InFlight)
			}
			for _, r := range res.Runs {
				if r.Batching && r.MeanBatch < 2 {
					t.Errorf("run %+v: a mean batch under 2 from one client with 8 in flight", r)
				}
			}
		})
	}
}

// TestRun_PythonReplicas runs --replica python briefly: the Go MLP, the
// torch MLP and the null module in Python replica processes, each with a
// window of 2, and checks that the torch replicas' outputs were bit-equal
// to the module's, that the hand-off was measured and that every replica
// took two lanes. It needs a python3 with torch, numpy and
// msgpack ($TENSORWIRE_PYTHON, /usr/bin/python3 or python3).
func TestRun_PythonReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Python processes")
	}
	py := testPython(t, "the Python replicas' run")
	out := filepath.Join(t.TempDir(), "serve.json")
	root, profiles := t.TempDir(), t.TempDir()
	run := benchtest.RunJSON(t, Run, testSelf, []string{"--replica", "python", "--clients", "2", "--python", py,
		"--duration", "300ms", "--limit-duration", "100ms", "--update-mb", "0", "--window", "2", "-v", "--root", root,
		"--profile", filepath.Join(profiles, "p"), "--json", out}, out)
	t.Logf("stdout:\n%s", run.Stdout)
	var res Result
	if err := json.Unmarshal(run.Data, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 6 {
		t.Fatalf("%d runs, want 6 (mlp, py-mlp, py-null, batching on and off)", len(res.Runs))
	}
	for i, r := range res.Runs {
		d := res.Details[i]
		if r.RequestsPerS <= 0 {
			t.Errorf("run %+v", r)
		}
		switch r.Model {
		case modelPyMLP:
			if d.BitEqual != "64/64" {
				t.Errorf("py-mlp, max batch %d: %s batches bit-equal to the module, want 64/64", r.MaxBatch, d.BitEqual)
			}
		case modelPyNull:
			if d.BatchesPerS <= 0 || d.CPUPerBatchMS <= 0 {
				t.Errorf("py-null: %v batches/s, %v ms CPU per batch", d.BatchesPerS, d.CPUPerBatchMS)
			}
		}
	}
	if !strings.Contains(run.Stdout, "hand-off, py-null") {
		t.Errorf("stdout lacks the hand-off's line")
	}
	// --window 2: each replica took two lanes (the node says so as a
	// replica leaves).
	if res.Config.Window != 2 || !strings.Contains(run.Stderr, "lanes=2") || strings.Contains(run.Stderr, "lanes=1") {
		t.Errorf("window %d in the JSON; the node's logs should say lanes=2 and never lanes=1:\n%s", res.Config.Window, run.Stderr)
	}
	if strings.Contains(run.Stderr, "detached") {
		t.Errorf("a replica was logged as detached for a fault during the runs (stopped with batches in flight, or its node stopped before it):\n%s", run.Stderr)
	}
	if left, _ := os.ReadDir(root); len(left) != 0 {
		t.Errorf("left under the root: %v", left)
	}
	// --profile: each Python run's first replica wrote its cProfile
	// report when stopped, with the batches it served.
	for _, model := range []string{modelPyMLP, modelPyNull} {
		for _, mb := range []int{1, 16} {
			b, err := os.ReadFile(filepath.Join(profiles, fmt.Sprintf("p-%s-2-%d-replica.txt", model, mb)))
			if err != nil {
				t.Error(err)
				continue
			}
			if txt := string(b); !strings.HasPrefix(txt, "cProfile of a "+model+" replica on cpu (window 2): ") ||
				strings.HasPrefix(txt, "cProfile of a "+model+" replica on cpu (window 2): 0 batches") ||
				!strings.Contains(txt, "(_run_batch)") {
				t.Errorf("%s, max batch %d: the replica's report:\n%s", model, mb, txt)
			}
		}
	}
}

// TestFakeModel_Cost: the fake model's forward lasts at least 1 ms + 5 us
// per row, and copies its parameters when it loads them.
func TestFakeModel_Cost(t *testing.T) {
	f := &fakeModel{}
	in, err := inputRows(16, 1)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := f.Forward(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < fakeBase+16*fakePerRow {
		t.Errorf("a forward of 16 rows took %v, less than its cost", took)
	}
	if err := schemaOut().Match(out.RowSchema()); err != nil || out.BatchSize()[0] != 16 {
		t.Errorf("outputs %v: %v", out.BatchSize(), err)
	}
	p, err := fakeParams(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Load(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	w, _ := p.Tensor("w")
	b, _ := w.Bytes()
	if !bytes.Equal(f.w, b) || &f.w[0] == &b[0] {
		t.Error("Load did not copy the parameters")
	}
	bad, _ := tensordict.New()
	if err := f.Load(context.Background(), bad); err == nil {
		t.Error("Load without w succeeded")
	}
}
