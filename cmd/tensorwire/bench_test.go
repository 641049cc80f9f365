package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBench_Usage(t *testing.T) {
	names := benchmarkNames()
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout or stderr
	}{
		{[]string{"bench"}, 2, "name a benchmark: " + names},
		{[]string{"bench", "nope"}, 2, `unknown benchmark "nope"`},
		{[]string{"bench", "replay", "--writers", "0"}, 2, "--writers must be at least 1"},
		{[]string{"bench", "replay", "--modes", "ref,pigeon"}, 2, `unknown mode "pigeon"`},
		{[]string{"bench", "replay", "extra"}, 2, `unexpected arguments ["extra"]`},
		{[]string{"bench", "replay", "-h"}, 0, "--sample-batch"},
	} {
		code, out, errOut := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%q: exit %d, want %d with %q in\n%s%s", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
	// Every benchmark is listed by "bench --help" and prints its flags.
	for _, help := range []string{"-h", "--help", "help"} {
		code, out, _ := runCLI(t, "bench", help)
		if code != 0 {
			t.Errorf("bench %s: exit %d", help, code)
		}
		for _, b := range benchmarks {
			if !strings.Contains(out, "tensorwire bench "+b.Name+": "+b.Summary) {
				t.Errorf("bench %s does not list %s:\n%s", help, b.Name, out)
			}
		}
	}
	for _, b := range benchmarks {
		code, out, errOut := runCLI(t, "bench", b.Name, "-h")
		if code != 0 || !strings.Contains(out, "usage: tensorwire bench "+b.Name+" [flags]") || !strings.Contains(out, "--json") {
			t.Errorf("bench %s -h: exit %d\n%s%s", b.Name, code, out, errOut)
		}
		if code, _, errOut := runCLI(t, "bench", b.Name, "--no-such-flag"); code != 2 || !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("bench %s --no-such-flag: exit %d\n%s", b.Name, code, errOut)
		}
	}
	if _, out, _ := runCLI(t, "help"); !strings.Contains(out, "tensorwire bench NAME") || !strings.Contains(out, names) {
		t.Errorf("help does not mention bench and %s:\n%s", names, out)
	}
}

// TestBench_Replay runs "tensorwire bench replay" as a process, briefly and
// in ref mode only: the command re-executes itself for the buffer node,
// the writers and the trainer.
func TestBench_Replay(t *testing.T) {
	bin := cliBinary(t)
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "out.json")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "replay", "--modes", "ref", "--capacity", "3000", "--duration", "500ms",
		"--memcpy-duration", "100ms", "--root", dir, "--json", jsonFile, "--log-file", filepath.Join(dir, "replay.log"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	data, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Ref *struct {
			Sampled float64 `json:"sample_transitions_per_s"`
			Torn    *int64  `json:"torn_rows_returned"`
		} `json:"ref"`
	}
	if err := json.Unmarshal(data, &got); err != nil || got.Ref == nil || got.Ref.Sampled <= 0 || got.Ref.Torn == nil || *got.Ref.Torn != 0 {
		t.Errorf("JSON %s (%v)\noutput:\n%s", data, err, out)
	}
}

// TestBench_Serve runs "tensorwire bench serve" briefly through the built
// binary, which re-executes itself for the node and the clients.
func TestBench_Serve(t *testing.T) {
	bin := cliBinary(t)
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "out.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "serve", "--clients", "2", "--model", "fake", "--duration", "300ms",
		"--limit-duration", "100ms", "--update-mb", "0", "--root", dir, "--json", jsonFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	data, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Runs []struct {
			Model        string  `json:"model"`
			RequestsPerS float64 `json:"requests_per_s"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(data, &got); err != nil || len(got.Runs) != 2 || got.Runs[0].Model != "fake" || got.Runs[0].RequestsPerS <= 0 {
		t.Errorf("JSON %s (%v)\noutput:\n%s", data, err, out)
	}
}

// TestBench_Collective runs "tensorwire bench collective" through the built
// binary, briefly (one op, two ranks, one size): the ranks are processes
// the binary starts of itself, and the table and JSON name both transports.
func TestBench_Collective(t *testing.T) {
	bin := cliBinary(t)
	jsonFile := filepath.Join(t.TempDir(), "out.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "collective", "--ops", "allreduce", "--ranks", "2", "--sizes", "64KB", "--gloo", "off", "--mpi", "off", "--json", jsonFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "busbw / memcpy") {
		t.Errorf("no table in the output:\n%s", out)
	}
	data, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Runs []struct {
			Op        string  `json:"op"`
			Transport string  `json:"transport"`
			BusBW     float64 `json:"busbw_GBps"`
		} `json:"runs"`
		Memcpy float64 `json:"memcpy_GBps"`
	}
	if err := json.Unmarshal(data, &got); err != nil || len(got.Runs) != 2 || got.Memcpy <= 0 {
		t.Fatalf("JSON %s (%v)", data, err)
	}
	for i, want := range []string{"shm", "tcp"} {
		if r := got.Runs[i]; r.Op != "allreduce" || r.Transport != want || r.BusBW <= 0 {
			t.Errorf("run %d: %+v, want allreduce over %s with a bandwidth", i, r, want)
		}
	}
}
