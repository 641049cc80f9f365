package replay

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/report"
)

// The seed stack's figures (torchrl's replay buffer over
// torch.distributed.rpc) and the project's goals against them and against
// the memcpy gather limit.
const (
	seedInsertPerS = 11000
	seedSamplePerS = 15000
	goalVsSeed     = 10
	goalVsMemcpy   = 0.5
)

// modeFigures are one mode's figures, as the JSON has them (Result). Latencies
// are the HdrHistogram quantiles (report.Latency) of every call, merged
// over the writers for Extend.
type modeFigures struct {
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
	figs   map[string]*modeFigures
	memcpy float64 // the run's memcpy gather limit: the best of the modes' measurements
}

func newReport(o *options, results map[string]*modeResult) *summary {
	s := &summary{o: o, figs: map[string]*modeFigures{}}
	for _, m := range o.modes {
		if r, ok := results[m]; ok {
			s.modes = append(s.modes, m)
			s.memcpy = max(s.memcpy, r.trainer.MemcpyGatherPerS)
		}
	}
	for _, m := range s.modes {
		s.figs[m] = results[m].figures(s.memcpy)
	}
	return s
}

// print writes the table and the notes under it.
func (s *summary) print(w io.Writer) error {
	o := s.o
	fmt.Fprintf(w, "replay: %d writer(s) x %d, 1 trainer x %d (prefetch %v), capacity %d (%.2f GB), min size %d, uniform sampler, "+
		"round-robin writer; %v timed per mode, after a warm-up of %d laps of the capacity\n\n",
		o.writers, o.batch, o.sampleBatch, o.prefetch, o.capacity, float64(o.capacity)*TransitionBytes/1e9, o.minSize, o.duration, warmLaps)
	tb := report.NewTable(append(append([]string{""}, s.modes...), "goal")...)
	rate := func(v float64) any { return int64(math.Round(v)) }
	// A row with a goal (met not nil) says, in the goal column, whether
	// each mode met it.
	rows := []struct {
		label string
		cell  func(f *modeFigures) any
		goal  string
		met   func(f *modeFigures) bool
	}{
		{"inserted/s", func(f *modeFigures) any { return rate(f.InsertPerS) }, "", nil},
		{"sampled/s", func(f *modeFigures) any { return rate(f.SamplePerS) }, "", nil},
		{"insert MB/s", func(f *modeFigures) any { return rate(f.InsertMBPerS) }, "", nil},
		{"sample MB/s", func(f *modeFigures) any { return rate(f.SampleMBPerS) }, "", nil},
		{"extend ms p50", func(f *modeFigures) any { return f.ExtendP50 }, "", nil},
		{"extend ms p99", func(f *modeFigures) any { return f.ExtendP99 }, "", nil},
		{"sample ms p50", func(f *modeFigures) any { return f.SampleP50 }, "", nil},
		{"sample ms p99", func(f *modeFigures) any { return f.SampleP99 }, "", nil},
		{"buffer heap MB (max)", func(f *modeFigures) any { return f.BufferHeapMB }, "", nil},
		{"torn rows returned", func(f *modeFigures) any { return f.TornRows }, "0",
			func(f *modeFigures) bool { return f.TornRows == 0 }},
		{"rows verified", func(f *modeFigures) any { return f.RowsVerified }, "", nil},
		{"rows resampled", func(f *modeFigures) any { return f.RowsResampled }, "", nil},
		{"first fill s", func(f *modeFigures) any { return f.FillS }, "", nil},
		{"warm-up s", func(f *modeFigures) any { return f.WarmupS }, "", nil},
		{"checkpoint s", func(f *modeFigures) any { return f.CheckpointS }, "", nil},
		{"sampled / memcpy limit", func(f *modeFigures) any { return f.SampleVsMemcpy }, fmt.Sprintf(">= %g", goalVsMemcpy),
			func(f *modeFigures) bool { return f.SampleVsMemcpy >= goalVsMemcpy }},
		{"inserted / seed", func(f *modeFigures) any { return f.InsertVsSeed }, fmt.Sprintf(">= %d", goalVsSeed),
			func(f *modeFigures) bool { return f.InsertVsSeed >= goalVsSeed }},
		{"sampled / seed", func(f *modeFigures) any { return f.SampleVsSeed }, fmt.Sprintf(">= %d", goalVsSeed),
			func(f *modeFigures) bool { return f.SampleVsSeed >= goalVsSeed }},
	}
	goals, met := 0, map[string]int{}
	for _, r := range rows {
		cells := []any{r.label}
		for _, m := range s.modes {
			cells = append(cells, r.cell(s.figs[m]))
		}
		goal := r.goal
		if r.met != nil {
			goals++
			var marks []string
			for _, m := range s.modes {
				if r.met(s.figs[m]) {
					met[m]++
					marks = append(marks, m+" met")
				} else {
					marks = append(marks, m+" NOT met")
				}
			}
			goal += ": " + strings.Join(marks, ", ")
		}
		tb.Row(append(cells, goal)...)
	}
	if _, err := tb.WriteTo(w); err != nil {
		return err
	}
	var tally []string
	for _, m := range s.modes {
		tally = append(tally, fmt.Sprintf("%s %d of %d", m, met[m], goals))
	}
	_, err := fmt.Fprintf(w, "\ngoals met: %s\n"+
		"memcpy gather limit: %.0f transitions/s (%.0f MB/s): batches of %d random rows of every leaf "+
		"copied out of the trainer's own mapping with copy(), warm, writers idle (the best of %s)\n"+
		"seed: the stack this project replaces, torchrl's RemoteTensorDictReplayBuffer over torch.distributed.rpc, "+
		"measured once on this machine class (not in this run): %d inserted/s, %d sampled/s\n",
		strings.Join(tally, "; "), s.memcpy, s.memcpy*TransitionBytes/1e6, o.sampleBatch, modesList(s.modes), seedInsertPerS, seedSamplePerS)
	return err
}

func modesList(modes []string) string {
	if len(modes) == 1 {
		return "one measurement"
	}
	return fmt.Sprintf("%d measurements, one before each mode's timed phase", len(modes))
}

// Result is the run's figures as the --json file has them.
type Result struct {
	Ref   *modeFigures `json:"ref,omitempty"`   // with --modes ref (the default includes it)
	Bytes *modeFigures `json:"bytes,omitempty"` // with --modes bytes
	// MemcpyGatherPerS is the run's memcpy gather limit: the best of the
	// modes' measurements. The ratios use it.
	MemcpyGatherPerS float64 `json:"memcpy_gather_transitions_per_s"`
	Config           Config  `json:"config"`
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
}

// result returns the figures as the JSON file has them.
func (s *summary) result() Result {
	o := s.o
	return Result{
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
		},
	}
}
