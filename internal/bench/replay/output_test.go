package replay

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestSummary_GoalMarks checks that the table says, for each goal, which
// modes met it, counts them, and says what the seed is.
func TestSummary_GoalMarks(t *testing.T) {
	s := &summary{
		o:     &options{writers: 2, batch: 64, sampleBatch: 256, capacity: 50000, minSize: 1000, duration: 20 * time.Second},
		modes: []string{modeRef, modeBytes},
		figs: map[string]*modeFigures{
			modeRef:   {SampleVsMemcpy: 0.29, InsertVsSeed: 17.3, SampleVsSeed: 11.3},
			modeBytes: {SampleVsMemcpy: 0.05, InsertVsSeed: 3.5, SampleVsSeed: 1.9, TornRows: 1},
		},
		memcpy: 594660,
		cores:  2,
		load:   "3.10",
	}
	var out bytes.Buffer
	if err := s.print(&out); err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for l := range strings.Lines(out.String()) {
		for _, label := range []string{"torn rows returned", "sampled / memcpy limit", "inserted / seed", "sampled / seed", "goals met:", "seed:"} {
			if strings.HasPrefix(l, label) {
				lines[label] = l
			}
		}
	}
	for label, want := range map[string]string{
		"torn rows returned":     "0: ref met, bytes NOT met",
		"sampled / memcpy limit": ">= 0.5: ref NOT met, bytes NOT met",
		"inserted / seed":        ">= 10: ref met, bytes NOT met",
		"sampled / seed":         ">= 10: ref met, bytes NOT met",
		"goals met:":             "ref 3 of 4; bytes 0 of 4",
		"seed:":                  "torchrl's RemoteTensorDictReplayBuffer over torch.distributed.rpc",
	} {
		if !strings.Contains(lines[label], want) {
			t.Errorf("line %q: %q, want it to contain %q\n%s", label, lines[label], want, out.String())
		}
	}
	if strings.Contains(lines["rows verified"], "met") {
		t.Errorf("a row without a goal is marked")
	}
	// Goals not met: the run says why, with this machine's cores and load.
	why := ""
	for l := range strings.Lines(out.String()) {
		if strings.HasPrefix(l, "why goals are NOT met:") {
			why = l
		}
	}
	for _, want := range []string{"2 cores", "load average 3.10", "--insert-rate", "docs/benchmarks.md"} {
		if !strings.Contains(why, want) {
			t.Errorf("the note on goals not met lacks %q: %q\n%s", want, why, out.String())
		}
	}
	// Every goal met: no such note.
	s.modes = []string{modeRef}
	s.figs[modeRef].SampleVsMemcpy = 0.6
	out.Reset()
	if err := s.print(&out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "NOT met") {
		t.Errorf("every goal met, yet:\n%s", out.String())
	}
}
