package replay

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
)

// TestRunSlices_EndToEnd runs the slice benchmark small, with an
// interpreter that has no torchrl: its rows say why they were skipped, and
// tensorwire's slices are all checked good, the Python client's too where
// a python3 has numpy and msgpack (else its rows say why not).
func TestRunSlices_EndToEnd(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "slices.json")
	out := benchtest.RunJSON(t, Run, testSelf, []string{"--sampler", "slice", "--capacity", "3000", "--duration", "200ms",
		"--root", dir, "--json", jsonFile, "--python", filepath.Join(dir, "no-python")}, jsonFile)
	t.Logf("stdout:\n%s", out.Stdout)
	var run SliceRun
	if err := json.Unmarshal(out.Data, &run); err != nil {
		t.Fatal(err)
	}
	if run.Capacity != 3000 || run.SliceLen != 32 || run.Batch != 256 || len(run.Results) != 8 {
		t.Fatalf("%+v", run)
	}
	_, noPython := findPython("")
	for _, r := range run.Results {
		isTorchrl := strings.HasPrefix(r.Impl, "torchrl")
		if strings.Contains(r.Impl, "Python") && noPython != nil {
			if r.Skipped == "" {
				t.Errorf("%s ran without a python3 with numpy and msgpack (%v)", r.Impl, noPython)
			}
			continue
		}
		if isTorchrl != (r.Skipped != "") {
			t.Errorf("%s: skipped %q", r.Impl, r.Skipped)
		}
		if !isTorchrl && (r.Slices == 0 || r.Bad != 0 || r.SlicesPS <= 0) {
			t.Errorf("%s: %+v", r.Impl, r)
		}
	}
	if !strings.Contains(out.Stdout, "skipped:") || !strings.Contains(out.Stdout, "every slice checked") {
		t.Errorf("table:\n%s", out.Stdout)
	}
}

func TestRunSlices_Usage(t *testing.T) {
	for _, args := range [][]string{
		{"--sampler", "slice", "--batch", "100"},
		{"--sampler", "slice", "--min-episode", "10"},
		{"--sampler=slice", "--obs", "0"},
	} {
		if !wantsSlices(args) {
			t.Errorf("%q: not the slice benchmark", args)
		}
	}
	if wantsSlices([]string{"--duration", "1s"}) || wantsSlices([]string{"--sampler", "uniform"}) {
		t.Error("the plain benchmark taken for the slice one")
	}
}
