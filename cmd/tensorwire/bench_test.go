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
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout or stderr
	}{
		{[]string{"bench"}, 2, "name a benchmark: replay"},
		{[]string{"bench", "nope"}, 2, `unknown benchmark "nope"`},
		{[]string{"bench", "replay", "--writers", "0"}, 2, "--writers must be at least 1"},
		{[]string{"bench", "replay", "--modes", "ref,pigeon"}, 2, `unknown mode "pigeon"`},
		{[]string{"bench", "-h"}, 0, "tensorwire bench replay:"},
		{[]string{"bench", "replay", "-h"}, 0, "--sample-batch"},
	} {
		code, out, errOut := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%q: exit %d, want %d with %q in\n%s%s", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
	if _, out, _ := runCLI(t, "help"); !strings.Contains(out, "tensorwire bench replay") {
		t.Errorf("help does not mention bench:\n%s", out)
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
		"--memcpy-duration", "100ms", "--root", dir, "--json", jsonFile)
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
