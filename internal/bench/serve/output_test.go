package serve

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestPrintGoals_OnlyForOneInFlight checks that the goal lines judge only
// the issues' workload: client processes each predicting one row at a
// time, as torch_spread's 8 clients do (issues 15, 26 and 30). With
// --in-flight N every client process keeps N predictions going, 8 of them
// are 8N concurrent clients, and a verdict against torch_spread's 8 would
// compare another workload: the run says the goals are not judged.
func TestPrintGoals_OnlyForOneInFlight(t *testing.T) {
	rep := &Result{
		Runs: []Figures{
			{Model: modelMLP, Clients: 8, MaxBatch: 16, Batching: true, RequestsPerS: 70000, P99: 0.8},
			{Model: modelMLP, Clients: 32, MaxBatch: 16, Batching: true, RequestsPerS: 300000, P99: 2},
			{Model: modelPyNull, Clients: 8, MaxBatch: 16, Batching: true, RequestsPerS: 8000, P99: 3, MeanBatch: 4},
		},
		Details:      []Detail{{VsLimit: 0.2}, {VsLimit: 0.9}, {BatchesPerS: 2000, CPUPerBatchMS: 0.3}},
		WeightUpdate: &Update{Clients: 32, ParamsMiB: 50, Loaded: 10, P99: 4, BaseP99: 4.5, P99Cost: -0.5},
	}
	for _, tc := range []struct {
		inFlight int
		want     []string // lines that start so
		not      []string // no line contains these
	}{
		{1, []string{"goal, mlp at 8 clients:", "goal, mlp at 32 clients:", "hand-off, py-null at 8 clients:", "goal, fake at 32 clients loading"},
			[]string{"not judged"}},
		{8, []string{"goals not judged: each client process kept 8 predictions in flight", "hand-off, py-null at 8 clients:", "fake at 32 clients loading"},
			[]string{"goal,", "met"}},
	} {
		var out bytes.Buffer
		rep.printGoals(&out, &options{inFlight: tc.inFlight, maxBatch: 16, updateEvery: 500 * time.Millisecond})
		for _, want := range tc.want {
			found := false
			for l := range strings.Lines(out.String()) {
				found = found || strings.HasPrefix(l, want)
			}
			if !found {
				t.Errorf("in flight %d: no line starting %q:\n%s", tc.inFlight, want, out.String())
			}
		}
		for _, not := range tc.not {
			if strings.Contains(out.String(), not) {
				t.Errorf("in flight %d: %q in:\n%s", tc.inFlight, not, out.String())
			}
		}
	}
}
