package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
)

// testSelf are the arguments with which Run re-executes the test binary
// for a role (bench.Env.Self), as cmd/tensorwire does.
var testSelf = []string{"bench", "replay"}

// testEnv is the bench.Env of Run in the tests.
func testEnv(stdout, stderr io.Writer) bench.Env {
	return bench.Env{Stdout: stdout, Stderr: stderr, Self: testSelf}
}

// TestMain lets Run re-execute the test binary for a role: "bench replay
// ARGS" runs Run(ARGS), as cmd/tensorwire does.
func TestMain(m *testing.M) { benchtest.Main(m, Run, testSelf...) }

// jsonKeys are the keys of the --json file and of its objects, as dotted
// paths, as the benchmark wrote them before its results became a typed
// struct (tensorwire bench replay --json, 2026-11-24), and the p99.9 keys
// added since. docs/benchmarks.md and scripts read them: they keep their
// names.
var jsonKeys = func() []string {
	keys := []string{"memcpy_gather_transitions_per_s", "config", "config.batch", "config.capacity", "config.duration_s",
		"config.insert_rate", "config.min_size", "config.modes", "config.prefetch", "config.sample_batch", "config.sampler",
		"config.seed_insert_transitions_per_s", "config.seed_sample_transitions_per_s", "config.trainers",
		"config.transition_bytes", "config.warmup_laps", "config.writer", "config.writers",
		// Added with the Python roles:
		"config.trainer", "config.writers_lang",
		// Added with the sharing levels (protocol version 4):
		"sharing", "sharing.bytes", "sharing.ref"}
	for _, mode := range []string{modeRef, modeBytes} {
		keys = append(keys, mode)
		for _, k := range []string{"buffer_heap_mb", "buffer_heap_polls", "checkpoint_s", "extend_calls", "extend_ms_p50",
			"extend_ms_p99", "fill_s", "insert_mb_per_s", "insert_transitions_per_s", "insert_vs_seed",
			"memcpy_gather_transitions_per_s", "node_resampled", "rows_resampled", "rows_verified", "sample_calls",
			"sample_mb_per_s", "sample_ms_p50", "sample_ms_p99", "sample_transitions_per_s", "sample_vs_memcpy_gather",
			"sample_vs_seed", "timed_s", "torn_rows_returned", "warmup_s", "warmup_sampled",
			// Added with the latency histograms:
			"extend_ms_p999", "sample_ms_p999"} {
			keys = append(keys, mode+"."+k)
		}
	}
	slices.Sort(keys)
	return keys
}()

// TestRun_EndToEnd runs the whole benchmark, both modes, with small
// settings, and checks its JSON and table.
//
// The trainer samples batches of 32: with 256, two writers overwrite a
// 3,000-slot buffer faster than replay's sample can re-check a batch
// (replay gives up after 16 rounds of rows overwritten while sampled).
func TestRun_EndToEnd(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "replay.json")
	logFile := filepath.Join(dir, "replay.log")
	out := benchtest.RunJSON(t, Run, testSelf, []string{"--capacity", "3000", "--duration", "1s",
		"--memcpy-duration", "200ms", "--root", dir, "--json", jsonFile, "--log-file", logFile}, jsonFile)
	t.Logf("stdout:\n%s", out.Stdout)

	if keys := benchtest.KeyPaths(out.JSON); !slices.Equal(keys, jsonKeys) {
		t.Errorf("JSON keys\n%q\nwant\n%q", keys, jsonKeys)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(out.Data, &got); err != nil {
		t.Fatal(err)
	}
	var limit float64
	if err := json.Unmarshal(got["memcpy_gather_transitions_per_s"], &limit); err != nil || limit <= 0 {
		t.Errorf("memcpy_gather_transitions_per_s = %s (%v)", got["memcpy_gather_transitions_per_s"], err)
	}
	for _, mode := range []string{modeRef, modeBytes} {
		var figs map[string]float64
		if err := json.Unmarshal(got[mode], &figs); err != nil {
			t.Fatalf("%s: %v in %s", mode, err, out.Data)
		}
		// The latencies come from the writers' and the trainer's histograms.
		for _, key := range []string{"insert_transitions_per_s", "sample_transitions_per_s", "extend_ms_p50",
			"extend_ms_p99", "extend_ms_p999", "sample_ms_p50", "sample_ms_p99", "sample_ms_p999", "buffer_heap_mb",
			"extend_calls", "sample_calls"} {
			if v, ok := figs[key]; !ok || v <= 0 {
				t.Errorf("%s: %s = %v (present %v), want > 0", mode, key, v, ok)
			}
		}
		if v, ok := figs["torn_rows_returned"]; !ok || v != 0 {
			t.Errorf("%s: torn_rows_returned = %v (present %v), want 0", mode, v, ok)
		}
		if figs["extend_ms_p50"] > figs["extend_ms_p99"] || figs["sample_ms_p99"] > figs["sample_ms_p999"] {
			t.Errorf("%s: percentiles out of order: %v", mode, figs)
		}
		if figs["rows_verified"] < figs["sample_transitions_per_s"]*0.5 {
			t.Errorf("%s: %v rows verified", mode, figs["rows_verified"])
		}
	}
	for _, s := range []string{"torn rows returned", "sampled / memcpy limit", "inserted / seed", "memcpy gather limit:"} {
		if !strings.Contains(out.Stdout, s) {
			t.Errorf("the report lacks %q", s)
		}
	}
	for _, mode := range []string{modeRef, modeBytes} {
		// The timed phase lasts a second, so a progress tick lands in it.
		p := "replay " + mode + ": "
		if !strings.Contains(out.Stderr, p+"timed ") && !strings.Contains(out.Stderr, p+"the timed phase began") {
			t.Errorf("no progress line of %s's timed phase on stderr", mode)
		}
	}
	// The processes' logs are in the log file, not among the progress.
	if strings.Contains(out.Stderr, "level=INFO") || !strings.Contains(out.Stderr, "logs are in "+logFile) {
		t.Errorf("stderr has INFO logs or does not name the log file:\n%s", out.Stderr)
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"replay benchmark", "role=buffer", "role=writer", "role=trainer", "memcpy gather limit"} {
		if !strings.Contains(string(logs), s) {
			t.Errorf("the log file lacks %q", s)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != filepath.Base(jsonFile) && e.Name() != filepath.Base(logFile) {
			t.Errorf("%s left behind under --root", e.Name())
		}
	}
}

// TestRun_Python runs the benchmark with the trainer and the writers in
// Python (the client in python/), in ref mode with small settings: each
// mode runs all in Go first, and the JSON has both, the Python run's under
// the usual keys. Nothing is left in the system's temporary folder (the
// client's copy for PYTHONPATH was a tensorwire-python-* folder there).
func TestRun_Python(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	defer func() {
		if left, err := os.ReadDir(tmp); err != nil || len(left) > 0 {
			var names []string
			for _, e := range left {
				names = append(names, e.Name())
			}
			t.Errorf("left in $TMPDIR: %v %v", names, err)
		}
	}()
	if _, err := findPython(""); err != nil {
		t.Skipf("no Python roles here: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "replay.json")
	var stdout, stderr bytes.Buffer
	err := Run(ctx, testEnv(&stdout, &stderr), []string{"--capacity", "3000", "--duration", "1s", "--sample-batch", "32",
		"--memcpy-duration", "200ms", "--root", dir, "--json", jsonFile, "--log-file", filepath.Join(dir, "replay.log"),
		"--modes", "ref", "--trainer", "python", "--writers-lang", "python"})
	if err != nil {
		t.Fatalf("Run: %v\nstderr:\n%s", err, stderr.String())
	}
	t.Logf("stdout:\n%s", stdout.String())
	data, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if res.Config.Trainer != langPython || res.Config.WritersLang != langPython || res.Go == nil || res.Go.Ref == nil || res.Ref == nil {
		t.Fatalf("JSON %s", data)
	}
	for _, f := range []*modeFigures{res.Ref, res.Go.Ref} {
		if f.SamplePerS <= 0 || f.InsertPerS <= 0 || f.SampleP50 <= 0 || f.ExtendP99 <= 0 || f.RowsVerified <= 0 || f.TornRows != 0 {
			t.Errorf("figures %+v", f)
		}
	}
	for _, s := range []string{"ref all Go", "ref Python trainer+writers", "sampled / all Go", "inserted / all Go"} {
		if !strings.Contains(stdout.String(), s) {
			t.Errorf("the report lacks %q", s)
		}
	}
	logs, err := os.ReadFile(filepath.Join(dir, "replay.log"))
	if err != nil || !strings.Contains(string(logs), "lang=python") {
		t.Errorf("the log file has no line of a Python role (%v)", err)
	}
}

// TestOptions_Logger checks where each process logs: the parent to a log
// file (a new one, or --log-file) with warnings on stderr too, or to stderr
// with -v; a role to --log-file, or to stderr without it.
func TestOptions_Logger(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared.log")
	for _, tc := range []struct {
		name     string
		o        options
		inStderr bool   // the INFO line goes to stderr
		file     string // the file it goes to; "new" for a new temporary one
	}{
		{"parent", options{}, false, "new"},
		{"parent -v", options{verbose: true}, true, ""},
		{"parent --log-file", options{logFile: shared}, false, shared},
		{"role", options{role: roleWriter}, true, ""},
		{"role --log-file", options{role: roleWriter, logFile: shared}, false, shared},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			o := tc.o
			log, closeLog, err := o.logger(&stderr)
			if err != nil {
				t.Fatal(err)
			}
			log.Info("an info line", "case", tc.name)
			log.Warn("a warning", "case", tc.name)
			if err := closeLog(); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(stderr.String(), "an info line"); got != tc.inStderr {
				t.Errorf("INFO on stderr: %v, want %v:\n%s", got, tc.inStderr, stderr.String())
			}
			if !strings.Contains(stderr.String(), "a warning") {
				t.Errorf("no warning on stderr:\n%s", stderr.String())
			}
			file := tc.file
			if file == "new" {
				file = o.logFile
				if file == "" || filepath.Dir(file) != filepath.Clean(os.TempDir()) {
					t.Fatalf("the parent's log file is %q", file)
				}
				defer os.Remove(file)
			}
			if file == "" {
				if o.childLogArgs() != nil {
					t.Errorf("children get %q, want no log file", o.childLogArgs())
				}
				return
			}
			if args := o.childLogArgs(); !slices.Equal(args, []string{"--log-file", file}) {
				t.Errorf("children get %q", args)
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(data), `msg="an info line" case=`+strconv.Quote(tc.name)) &&
				!strings.Contains(string(data), `msg="an info line" case=`+tc.name) || !strings.Contains(string(data), "a warning") {
				t.Errorf("%s holds:\n%s", file, data)
			}
		})
	}
	// The shared file got both cases that wrote to it: appended, not truncated.
	if data, _ := os.ReadFile(shared); strings.Count(string(data), "an info line") != 2 {
		t.Errorf("the shared log file holds:\n%s", data)
	}
}

// TestOptions_LoggerShared has the parent and a child log to the parent's
// new log file in turn, as in a run: every line must arrive whole.
func TestOptions_LoggerShared(t *testing.T) {
	var stderr bytes.Buffer
	parent := options{}
	plog, closeParent, err := parent.logger(&stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(parent.logFile)
	child := options{role: roleWriter, logFile: parent.logFile}
	clog, closeChild, err := child.logger(&stderr)
	if err != nil {
		t.Fatal(err)
	}
	plog.Info("parent one")
	clog.Info("child one")
	plog.Info("parent two")
	clog.Info("child two")
	closeParent()
	closeChild()
	data, err := os.ReadFile(parent.logFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), data)
	}
	for i, want := range []string{"parent one", "child one", "parent two", "child two"} {
		if !strings.HasPrefix(lines[i], "time=") || !strings.Contains(lines[i], `msg="`+want+`"`) {
			t.Errorf("line %d is %q, want the whole line of %q", i+1, lines[i], want)
		}
	}
}

func TestRun_Usage(t *testing.T) {
	for _, args := range [][]string{
		{"--writers", "0"},
		{"--modes", "ref,carrier-pigeon"},
		{"--modes", "ref,ref"},
		{"--min-size", "10", "--capacity", "5"},
		{"--role", "writer"},
		{"--role", "buffer"},
		{"--role", "oracle"},
		{"--trainer", "julia"},
		{"--writers-lang", "c"},
		{"--role", "trainer", "--addr", "x:1", "--trainer", "python"},
		{"--nope"},
		{"extra"},
	} {
		var out bytes.Buffer
		if err := Run(context.Background(), testEnv(&out, &out), args); !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	if err := Run(context.Background(), testEnv(&out, &out), []string{"-h"}); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(out.String(), "--sample-batch") || strings.Contains(out.String(), "--child") {
		t.Errorf("-h: %v\n%s", err, out.String())
	}
}
