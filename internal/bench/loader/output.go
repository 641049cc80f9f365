package loader

import (
	"fmt"
	"io"
	"runtime"

	"github.com/tensorwire/tensorwire/internal/bench/report"
)

// Result is what --json writes.
type Result struct {
	Date    string            `json:"date"`
	CPUs    int               `json:"cpus"`
	Procs   int               `json:"procs"`   // --procs: GOMAXPROCS of every process of a run; 0: Go's default
	Bytes   bool              `json:"bytes"`   // --bytes: the shared consumers got their batches as bytes, not from the ring
	Samples map[string]int    `json:"samples"` // per workload, per epoch
	Source  map[string]string `json:"source"`  // where each workload's dataset came from
	Runs    []Figures         `json:"runs"`
}

// Figures are one run's figures. The first keys are those issue 16 names.
type Figures struct {
	Dataset                string  `json:"dataset"` // "synthetic" or "fashion-mnist"
	Consumers              int     `json:"consumers"`
	Mode                   string  `json:"mode"`                       // "shared" or "independent"
	SamplesPerSPerConsumer float64 `json:"samples_per_s_per_consumer"` // the mean over the consumers of samples / their epoch's time
	CPUS                   float64 `json:"cpu_s"`                      // CPU seconds of every process over the epoch: consumers and producer node
	NetBytesPerBatch       float64 `json:"net_bytes_per_batch"`        // bytes the consumers read and wrote on sockets, per consumer batch
	ExactlyOnce            bool    `json:"exactly_once"`               // every consumer saw every sample once, each whole

	BatchSizes     []int     `json:"batch_sizes"`       // the consumers'
	Samples        int       `json:"samples"`           // per epoch
	MinSamplesPerS float64   `json:"min_samples_per_s"` // the slowest consumer's
	ElapsedS       float64   `json:"elapsed_s"`         // the slowest consumer's epoch
	ProducerCPUS   float64   `json:"producer_cpu_s"`    // the node's part of cpu_s (10 ms resolution)
	ConsumerCPUS   []float64 `json:"consumer_cpu_s"`    // each consumer's part
	Problem        string    `json:"problem,omitempty"` // the first thing a consumer found wrong
}

// tensorsocket's figures on workload (a), measured on this machine class
// (issue 16): samples/s per consumer, independent loaders alike.
const (
	tensorsocket4  = 335.0
	goalVsSocket   = 20.0
	goalCPUFashion = 0.35
)

func printResult(w io.Writer, o *options, res *Result) {
	res.CPUs, res.Procs, res.Bytes = runtime.NumCPU(), o.procs, o.bytes
	t := report.NewTable("dataset", "consumers", "batches", "mode", "samples/s/consumer", "slowest", "cpu s", "producer cpu s", "net B/batch", "exactly once")
	for _, r := range res.Runs {
		t.Row(r.Dataset, r.Consumers, fmt.Sprint(r.BatchSizes), r.Mode, r.SamplesPerSPerConsumer, r.MinSamplesPerS, r.CPUS,
			r.ProducerCPUS, r.NetBytesPerBatch, fmt.Sprint(r.ExactlyOnce))
	}
	t.WriteTo(w)
	procs := "Go's default GOMAXPROCS"
	if o.procs > 0 {
		procs = fmt.Sprintf("GOMAXPROCS %d in every process", o.procs)
	}
	fmt.Fprintf(w, "\n%d CPUs, %s; %d epoch(s) per run (%s), %d (%s), figures per epoch; training step %v (%s), %v (%s); datasets: ",
		res.CPUs, procs, o.epochs, synthetic, o.fepochs, fashion, o.step, synthetic, o.fstep, fashion)
	for d, s := range res.Source {
		fmt.Fprintf(w, "%s: %s (%d samples); ", d, s, res.Samples[d])
	}
	fmt.Fprintln(w)
	if o.bytes {
		fmt.Fprintln(w, "--bytes: the shared consumers got every batch as bytes on their streams (loader.Options.Bytes);"+
			" the goals below are set for consumers that map the ring, and compare bytes mode with them")
	}
	for _, line := range goals(res) {
		fmt.Fprintln(w, line)
	}
}

// goals compares the runs with issue 16's goals.
func goals(res *Result) []string {
	find := func(d, m string, n int, mixed bool) *Figures {
		for i, r := range res.Runs {
			if r.Dataset == d && r.Mode == m && r.Consumers == n && (len(r.BatchSizes) > 1 && r.BatchSizes[0] != r.BatchSizes[1]) == mixed {
				return &res.Runs[i]
			}
		}
		return nil
	}
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	var out []string
	for _, n := range []int{1, 2, 3, 4, 8} {
		s, ind := find(synthetic, shared, n, false), find(synthetic, independent, n, false)
		if s == nil || ind == nil {
			continue
		}
		out = append(out, fmt.Sprintf("goal (a), %d consumers: the slowest shared consumer at least as fast as independent loaders: %.0f vs %.0f samples/s: %s",
			n, s.MinSamplesPerS, ind.SamplesPerSPerConsumer, met(s.MinSamplesPerS >= ind.SamplesPerSPerConsumer)))
		if n == 4 {
			out = append(out, fmt.Sprintf("goal (a), 4 consumers: at least %.0fx tensorsocket's %.0f samples/s: %.0f (%.1fx): %s",
				goalVsSocket, tensorsocket4, s.MinSamplesPerS, s.MinSamplesPerS/tensorsocket4, met(s.MinSamplesPerS >= goalVsSocket*tensorsocket4)))
		}
	}
	if m := find(synthetic, shared, 3, true); m != nil {
		out = append(out, fmt.Sprintf("goal (a): mixed batch sizes %v working, each index exactly once: %s", m.BatchSizes, met(m.ExactlyOnce)))
	}
	s, ind := find(fashion, shared, 4, false), find(fashion, independent, 4, false)
	if s != nil && ind != nil && ind.CPUS > 0 {
		out = append(out, fmt.Sprintf("goal (b), 4 consumers: CPU per epoch at most %.2f of independent loaders': %.2f s vs %.2f s = %.2f: %s",
			goalCPUFashion, s.CPUS, ind.CPUS, s.CPUS/ind.CPUS, met(s.CPUS <= goalCPUFashion*ind.CPUS)))
	}
	all := true
	for _, r := range res.Runs {
		all = all && r.ExactlyOnce
	}
	out = append(out, fmt.Sprintf("every run: every consumer saw each sample exactly once: %s", met(all)))
	return out
}
