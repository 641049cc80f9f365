package replay

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/report"
)

// The seed stack's figures (torchrl's replay buffer over
// torch.distributed.rpc) and the project's goals against them and against
// the memcpy gather limit.
const (
	seedInsertPerS = 11000
	seedSamplePerS = 15000
	goalVsSeed     = 10
	goalVsMemcpy   = 0.5

	// goalVsGoTrainer is a Python trainer's goal against the Go trainer
	// of the same invocation (issue 18).
	goalVsGoTrainer = 0.5
)

// modeFigures are one mode's figures, as the JSON has them (Result). Latencies
// are the HdrHistogram quantiles (report.Latency) of every call, merged
// over the writers for Extend.
type modeFigures struct {
	Sharing      string  `json:"-"` // the trainer's and the writers' with the node (rpc.Sharing), "trainer/writers" when they differ; in Result.Sharing
	InsertPerS   float64 `json:"insert_transitions_per_s"`
	SamplePerS   float64 `json:"sample_transitions_per_s"`
	ExtendP50    float64 `json:"extend_ms_p50"`
	ExtendP99    float64 `json:"extend_ms_p99"`
	ExtendP999   float64 `json:"extend_ms_p999"`
	SampleP50    float64 `json:"sample_ms_p50"`
	SampleP99    float64 `json:"sample_ms_p99"`
	SampleP999   float64 `json:"sample_ms_p999"`
	BufferHeapMB float64 `json:"buffer_heap_mb"`
	TornRows     int64   `json:"torn_rows_returned"`

	InsertMBPerS     float64 `json:"insert_mb_per_s"`
	SampleMBPerS     float64 `json:"sample_mb_per_s"`
	SampleVsMemcpy   float64 `json:"sample_vs_memcpy_gather"` // against the run's limit
	InsertVsSeed     float64 `json:"insert_vs_seed"`
	SampleVsSeed     float64 `json:"sample_vs_seed"`
	RowsVerified     int64   `json:"rows_verified"`  // every row the trainer got, warm-up included
	RowsResampled    int64   `json:"rows_resampled"` // timed: sampled again because overwritten while read
	NodeResampled    int64   `json:"node_resampled"` // timed: Stats.Resampled (samples the node gathered itself)
	ExtendCalls      int64   `json:"extend_calls"`
	SampleCalls      int64   `json:"sample_calls"`
	TimedS           float64 `json:"timed_s"`  // the trainer's timed phase, as it measured it
	FillS            float64 `json:"fill_s"`   // the slowest writer's, to write its share of the capacity once
	WarmupS          float64 `json:"warmup_s"` // the slowest writer's, to write it warmLaps times
	WarmupSampled    int64   `json:"warmup_sampled"`
	CheckpointS      float64 `json:"checkpoint_s"` // the buffer's checkpoint after the run
	HeapPolls        int     `json:"buffer_heap_polls"`
	MemcpyGatherPerS float64 `json:"memcpy_gather_transitions_per_s"` // measured before this mode's timed phase
}

// figures computes a mode's figures from its processes' results; limit is
// the run's memcpy gather limit.
func (r *modeResult) figures(limit float64) *modeFigures {
	f := &modeFigures{
		Sharing:          r.sharing(),
		BufferHeapMB:     float64(r.trainer.HeapMaxBytes) / 1e6,
		TornRows:         r.trainer.TornRows,
		RowsVerified:     r.trainer.RowsVerified,
		RowsResampled:    r.trainer.Resampled,
		NodeResampled:    r.trainer.NodeResampled,
		SampleCalls:      r.trainer.Sample.Count(),
		TimedS:           time.Duration(r.trainer.ElapsedNS).Seconds(),
		WarmupSampled:    r.trainer.WarmupTransitions,
		CheckpointS:      time.Duration(r.buffer.DoneCheckpointNS).Seconds(),
		HeapPolls:        r.trainer.HeapPolls,
		MemcpyGatherPerS: r.trainer.MemcpyGatherPerS,
	}
	var extends report.Latency // every writer's
	for _, w := range r.writers {
		f.InsertPerS += perS(w.Transitions, w.ElapsedNS)
		f.FillS = max(f.FillS, time.Duration(w.FillNS).Seconds())
		f.WarmupS = max(f.WarmupS, time.Duration(w.WarmupNS).Seconds())
		extends.Merge(&w.Extend)
	}
	f.SamplePerS = perS(r.trainer.Transitions, r.trainer.ElapsedNS)
	f.ExtendCalls = extends.Count()
	ext, smp := extends.Stats(), r.trainer.Sample.Stats()
	f.ExtendP50, f.ExtendP99, f.ExtendP999 = report.Ms(ext.P50), report.Ms(ext.P99), report.Ms(ext.P999)
	f.SampleP50, f.SampleP99, f.SampleP999 = report.Ms(smp.P50), report.Ms(smp.P99), report.Ms(smp.P999)
	f.InsertMBPerS = f.InsertPerS * TransitionBytes / 1e6
	f.SampleMBPerS = f.SamplePerS * TransitionBytes / 1e6
	if limit > 0 {
		f.SampleVsMemcpy = f.SamplePerS / limit
	}
	f.InsertVsSeed = f.InsertPerS / seedInsertPerS
	f.SampleVsSeed = f.SamplePerS / seedSamplePerS
	return f
}

func perS(n, ns int64) float64 {
	if ns <= 0 {
		return 0
	}
	return float64(n) / time.Duration(ns).Seconds()
}

// summary is the run's report.
type summary struct {
	o      *options
	modes  []string
	figs   map[string]*modeFigures // per mode: the run with the roles in their --trainer and --writers-lang languages
	goFigs map[string]*modeFigures // per mode, when a role is Python: the same mode all in Go, run just before
	memcpy float64                 // the run's memcpy gather limit: the best of the modes' measurements
	cores  int                     // the machine's, for the note on goals not met
	load   string                  // the 1-minute load average when the run ended; "" if unknown
}

// loadAverage returns the 1-minute load average (Linux's /proc/loadavg),
// or "" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// newReport builds the report of the modes' results and, when a role is
// Python, of their all-Go runs (goResults; nil otherwise).
func newReport(o *options, results, goResults map[string]*modeResult) *summary {
	s := &summary{o: o, figs: map[string]*modeFigures{}, goFigs: map[string]*modeFigures{}, cores: runtime.NumCPU(), load: loadAverage()}
	for _, m := range o.modes {
		if r, ok := results[m]; ok {
			s.modes = append(s.modes, m)
			s.memcpy = max(s.memcpy, r.trainer.MemcpyGatherPerS)
		}
		if r, ok := goResults[m]; ok {
			s.memcpy = max(s.memcpy, r.trainer.MemcpyGatherPerS)
		}
	}
	for _, m := range s.modes {
		s.figs[m] = results[m].figures(s.memcpy)
		if r, ok := goResults[m]; ok {
			s.goFigs[m] = r.figures(s.memcpy)
		}
	}
	return s
}

// column is a column of the table: a mode's figures, and for a run with
// Python roles the same mode's all-Go figures (vsGo), which get a column
// of their own just before it.
type column struct {
	label string
	figs  *modeFigures
	vsGo  *modeFigures
}

func (s *summary) columns() []column {
	var cols []column
	for _, m := range s.modes {
		g, ok := s.goFigs[m]
		if !ok {
			cols = append(cols, column{label: m, figs: s.figs[m]})
			continue
		}
		cols = append(cols, column{label: m + " all Go", figs: g}, column{label: m + " " + s.o.langs(), figs: s.figs[m], vsGo: g})
	}
	return cols
}

// langs names the Python roles of a run, for column labels.
func (o *options) langs() string {
	switch {
	case o.trainerLang == langPython && o.writersLang == langPython:
		return "Python trainer+writers"
	case o.trainerLang == langPython:
		return "Python trainer"
	case o.writersLang == langPython:
		return "Python writers"
	}
	return "Go"
}

// print writes the table and the notes under it.
func (s *summary) print(w io.Writer) error {
	o := s.o
	fmt.Fprintf(w, "replay: %d writer(s) x %d, 1 trainer x %d (prefetch %v), capacity %d (%.2f GB), min size %d, uniform sampler, "+
		"round-robin writer; %v timed per mode, after a warm-up of %d laps of the capacity\n",
		o.writers, o.batch, o.sampleBatch, o.prefetch, o.capacity, float64(o.capacity)*TransitionBytes/1e9, o.minSize, o.duration, warmLaps)
	if o.pythonRun() {
		fmt.Fprintf(w, "trainer in %s, writers in %s (Python: the client in python/, numpy, run by %s); each mode ran all in Go "+
			"first, for comparison\n", o.trainerLang, o.writersLang, o.python)
	}
	fmt.Fprintln(w)
	cols := s.columns()
	labels := []string{""}
	for _, c := range cols {
		labels = append(labels, c.label)
	}
	tb := report.NewTable(append(labels, "goal")...)
	rate := func(v float64) any { return int64(math.Round(v)) }
	// A row with a goal (met not nil) says, in the goal column, whether
	// each column met it. A row with vs set has cells only in the columns
	// of runs with Python roles.
	type row struct {
		label string
		cell  func(f *modeFigures) any
		goal  string
		met   func(f *modeFigures) bool
		vs    func(f, goFigs *modeFigures) float64
	}
	rows := []row{
		{label: "sharing with the node", cell: func(f *modeFigures) any { return cmp.Or(f.Sharing, "-") }},
		{label: "inserted/s", cell: func(f *modeFigures) any { return rate(f.InsertPerS) }},
		{label: "sampled/s", cell: func(f *modeFigures) any { return rate(f.SamplePerS) }},
		{label: "insert MB/s", cell: func(f *modeFigures) any { return rate(f.InsertMBPerS) }},
		{label: "sample MB/s", cell: func(f *modeFigures) any { return rate(f.SampleMBPerS) }},
		{label: "extend ms p50", cell: func(f *modeFigures) any { return f.ExtendP50 }},
		{label: "extend ms p99", cell: func(f *modeFigures) any { return f.ExtendP99 }},
		{label: "sample ms p50", cell: func(f *modeFigures) any { return f.SampleP50 }},
		{label: "sample ms p99", cell: func(f *modeFigures) any { return f.SampleP99 }},
		{label: "buffer heap MB (max)", cell: func(f *modeFigures) any { return f.BufferHeapMB }},
		{label: "torn rows returned", cell: func(f *modeFigures) any { return f.TornRows }, goal: "0",
			met: func(f *modeFigures) bool { return f.TornRows == 0 }},
		{label: "rows verified", cell: func(f *modeFigures) any { return f.RowsVerified }},
		{label: "rows resampled", cell: func(f *modeFigures) any { return f.RowsResampled }},
		{label: "first fill s", cell: func(f *modeFigures) any { return f.FillS }},
		{label: "warm-up s", cell: func(f *modeFigures) any { return f.WarmupS }},
		{label: "checkpoint s", cell: func(f *modeFigures) any { return f.CheckpointS }},
		{label: "sampled / memcpy limit", cell: func(f *modeFigures) any { return f.SampleVsMemcpy }, goal: fmt.Sprintf(">= %g", goalVsMemcpy),
			met: func(f *modeFigures) bool { return f.SampleVsMemcpy >= goalVsMemcpy }},
		{label: "inserted / seed", cell: func(f *modeFigures) any { return f.InsertVsSeed }, goal: fmt.Sprintf(">= %d", goalVsSeed),
			met: func(f *modeFigures) bool { return f.InsertVsSeed >= goalVsSeed }},
		{label: "sampled / seed", cell: func(f *modeFigures) any { return f.SampleVsSeed }, goal: fmt.Sprintf(">= %d", goalVsSeed),
			met: func(f *modeFigures) bool { return f.SampleVsSeed >= goalVsSeed }},
	}
	if o.trainerLang == langPython {
		rows = append(rows, row{label: "sampled / all Go", goal: fmt.Sprintf(">= %g", goalVsGoTrainer),
			vs: func(f, g *modeFigures) float64 { return ratio(f.SamplePerS, g.SamplePerS) }})
	}
	if o.writersLang == langPython {
		rows = append(rows, row{label: "inserted / all Go", vs: func(f, g *modeFigures) float64 { return ratio(f.InsertPerS, g.InsertPerS) }})
	}
	goals, met := map[string]int{}, map[string]int{}
	for _, r := range rows {
		cells := []any{r.label}
		var marks []string
		for _, c := range cols {
			switch {
			case r.vs == nil:
				cells = append(cells, r.cell(c.figs))
			case c.vsGo != nil:
				cells = append(cells, r.vs(c.figs, c.vsGo))
			default:
				cells = append(cells, "")
			}
			if r.goal == "" || r.vs != nil && c.vsGo == nil {
				continue
			}
			goals[c.label]++
			ok := r.met != nil && r.met(c.figs) || r.vs != nil && r.vs(c.figs, c.vsGo) >= goalVsGoTrainer
			if ok {
				met[c.label]++
				marks = append(marks, c.label+" met")
			} else {
				marks = append(marks, c.label+" NOT met")
			}
		}
		goal := r.goal
		if len(marks) > 0 {
			goal += ": " + strings.Join(marks, ", ")
		}
		tb.Row(append(cells, goal)...)
	}
	if _, err := tb.WriteTo(w); err != nil {
		return err
	}
	var tally []string
	missed := false
	for _, c := range cols {
		tally = append(tally, fmt.Sprintf("%s %d of %d", c.label, met[c.label], goals[c.label]))
		missed = missed || met[c.label] < goals[c.label]
	}
	defer func() {
		if missed {
			s.printWhyNotMet(w)
		}
	}()
	_, err := fmt.Fprintf(w, "\ngoals met: %s\n"+
		"memcpy gather limit: %.0f transitions/s (%.0f MB/s): batches of %d random rows of every leaf "+
		"copied out of the trainer's own mapping with copy() (a Python trainer: numpy's take), warm, writers idle (the best of %s)\n"+
		"seed: the stack this project replaces, torchrl's RemoteTensorDictReplayBuffer over torch.distributed.rpc, "+
		"measured once on this machine class (not in this run): %d inserted/s, %d sampled/s\n",
		strings.Join(tally, "; "), s.memcpy, s.memcpy*TransitionBytes/1e6, o.sampleBatch, modesList(len(cols)), seedInsertPerS, seedSamplePerS)
	return err
}

// printWhyNotMet says why goals are not met, as far as the run can tell:
// what the goals were set for and what the runs of record met, the
// machine's cores and load.
func (s *summary) printWhyNotMet(w io.Writer) {
	load := ""
	if s.load != "" {
		load = fmt.Sprintf("; load average %s as the run ended: other work on it slows every figure", s.load)
	}
	fmt.Fprintf(w, "why goals are NOT met: they were set for this machine class, 2 cores, where the node, %d writer(s) and the "+
		"trainer share the cores (this machine: %d cores%s). By reference the eight runs of 2026-12-01 in docs/benchmarks.md met the insert "+
		"and sampling goals (22.6x-28.9x the seed's inserts, 13.4x-17.1x its samples); half the memcpy limit only with the "+
		"writers capped (--insert-rate 20000), since the limit is measured with the writers idle. Bytes mode ships every "+
		"row through the node's connections: 5.8x-7.5x the seed's inserts and 2.3x-2.7x its samples in those runs. "+
		"docs/benchmarks.md, \"Replay buffer\", has the runs.\n", s.o.writers, s.cores, load)
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func modesList(runs int) string {
	if runs == 1 {
		return "one measurement"
	}
	return fmt.Sprintf("%d measurements, one before each run's timed phase", runs)
}

// Result is the run's figures as the --json file has them.
type Result struct {
	Ref   *modeFigures `json:"ref,omitempty"`   // with --modes ref (the default includes it)
	Bytes *modeFigures `json:"bytes,omitempty"` // with --modes bytes
	// MemcpyGatherPerS is the run's memcpy gather limit: the best of the
	// modes' measurements. The ratios use it.
	MemcpyGatherPerS float64 `json:"memcpy_gather_transitions_per_s"`
	Config           Config  `json:"config"`
	// Sharing is each mode's sharing level with the node, as its trainer
	// and writers saw it at Dial (rpc.Sharing: "coherent", "storage",
	// "none"; "trainer/writers" when they differ).
	Sharing map[string]string `json:"sharing,omitempty"`
	// Go holds, when the trainer or the writers are Python (Config.Trainer,
	// Config.WritersLang), each mode's figures all in Go, run just before in
	// the same invocation, for comparison: the keys above are the Python
	// run's.
	Go *GoResult `json:"go,omitempty"`
}

// GoResult is the all-Go runs of an invocation with Python roles.
type GoResult struct {
	Ref   *modeFigures `json:"ref,omitempty"`
	Bytes *modeFigures `json:"bytes,omitempty"`
}

// Config is the run's settings, as the --json file has them.
type Config struct {
	Prefetch        bool     `json:"prefetch"`
	InsertRate      float64  `json:"insert_rate"` // all writers together; 0: as fast as they can
	Writers         int      `json:"writers"`
	Trainers        int      `json:"trainers"`
	Capacity        int      `json:"capacity"`
	Batch           int      `json:"batch"`        // transitions per Extend
	SampleBatch     int      `json:"sample_batch"` // transitions per SampleInto
	MinSize         int      `json:"min_size"`
	DurationS       float64  `json:"duration_s"` // of each mode's timed phase
	WarmupLaps      int      `json:"warmup_laps"`
	TransitionBytes int      `json:"transition_bytes"`
	Sampler         string   `json:"sampler"`
	Writer          string   `json:"writer"`
	Modes           []string `json:"modes"` // those that ran, in order
	SeedInsertPerS  int      `json:"seed_insert_transitions_per_s"`
	SeedSamplePerS  int      `json:"seed_sample_transitions_per_s"`
	Trainer         string   `json:"trainer"`      // the trainer's language: "go" or "python"
	WritersLang     string   `json:"writers_lang"` // the writers' language: "go" or "python"
}

// result returns the figures as the JSON file has them.
func (s *summary) result() Result {
	o := s.o
	var g *GoResult
	if len(s.goFigs) > 0 {
		g = &GoResult{Ref: s.goFigs[modeRef], Bytes: s.goFigs[modeBytes]}
	}
	sharing := map[string]string{}
	for m, f := range s.figs {
		if f.Sharing != "" {
			sharing[m] = f.Sharing
		}
	}
	return Result{
		Sharing:          sharing,
		Go:               g,
		Ref:              s.figs[modeRef],
		Bytes:            s.figs[modeBytes],
		MemcpyGatherPerS: s.memcpy,
		Config: Config{
			Prefetch:        o.prefetch,
			InsertRate:      o.insertRate,
			Writers:         o.writers,
			Trainers:        trainers,
			Capacity:        o.capacity,
			Batch:           o.batch,
			SampleBatch:     o.sampleBatch,
			MinSize:         o.minSize,
			DurationS:       o.duration.Seconds(),
			WarmupLaps:      warmLaps,
			TransitionBytes: TransitionBytes,
			Sampler:         "uniform",
			Writer:          "round_robin",
			Modes:           slices.Clone(s.modes),
			SeedInsertPerS:  seedInsertPerS,
			SeedSamplePerS:  seedSamplePerS,
			Trainer:         o.trainerLang,
			WritersLang:     o.writersLang,
		},
	}
}

// sharing returns the run's sharing level with the node as its roles saw
// it at Dial: the trainer's, or "trainer/writers" when a writer's differs.
func (r *modeResult) sharing() string {
	t := r.trainer.Sharing
	for _, w := range r.writers {
		if w.Sharing != t {
			return t + "/" + w.Sharing
		}
	}
	return t
}
