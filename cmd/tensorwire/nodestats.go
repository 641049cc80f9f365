package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var statsCmd = command{
	name:  "stats",
	usage: "tensorwire stats [--json] [--all] [--timeout D] ADDR",
	help: "print the metrics of a node started with --metrics ADDR (HOST:PORT, or the URL of its /metrics), " +
		"as a table grouped by what they count: rpc (calls by service, served object, method and code; " +
		"their latency, as a count, a mean and the 50th and 99th percentiles' bucket bounds; bytes by value " +
		"and by reference; peers), then each replay buffer, store, model and loader; --json prints the same " +
		"as JSON, --all adds the Go runtime's and the process's figures (docs/operations.md lists them all)",
	run: runStats,
}

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	all := fs.Bool("all", false, "also the Go runtime's (go_*) and the process's (process_*) figures")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the node's answer")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: want one ADDR, got %q", errUsage, pos)
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: --timeout %v: want a positive duration", errUsage, *timeout)
	}
	url := metricsAddrURL(pos[0])
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	fams, err := scrape(ctx, url)
	if err != nil {
		return err
	}
	series := flatten(fams, *all)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(statsJSON{URL: url, Metrics: series})
	}
	return printSeries(stdout, series)
}

// metricsAddrURL returns the URL of the metrics at addr: addr itself when
// it is a URL, http://addr when it has a path, else http://addr/metrics.
func metricsAddrURL(addr string) string {
	switch {
	case strings.Contains(addr, "://"):
		return addr
	case strings.Contains(addr, "/"):
		return "http://" + addr
	}
	return "http://" + addr + "/metrics"
}

// scrape gets url and parses Prometheus's text format.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return fams, nil
}

// statsJSON is what --json prints.
type statsJSON struct {
	URL     string   `json:"url"`
	Metrics []series `json:"metrics"`
}

// series is one time series of the scrape: a counter's or gauge's value, or
// a histogram's count, sum, buckets and estimated percentiles.
type series struct {
	Name   string            `json:"name"`
	Type   string            `json:"type"` // counter, gauge, histogram, summary, untyped
	Labels map[string]string `json:"labels,omitempty"`
	Value  *float64          `json:"value,omitempty"` // counters, gauges, untyped

	Count   *uint64  `json:"count,omitempty"` // histograms and summaries
	Sum     *float64 `json:"sum,omitempty"`
	Buckets []bucket `json:"buckets,omitempty"` // cumulative, +Inf left out (it is Count)
	// P50 and P99 are the upper bounds of the buckets that hold the 50th
	// and 99th percentiles (histograms with observations); +Inf is left out.
	P50 *float64 `json:"p50,omitempty"`
	P99 *float64 `json:"p99,omitempty"`

	labels string // for sorting and the table: k=v k=v
}

type bucket struct {
	LE    float64 `json:"le"`
	Count uint64  `json:"count"`
}

// flatten turns the scrape into series sorted by name and labels: the
// tensorwire_* ones, and with all also go_*, process_* and the rest.
func flatten(fams map[string]*dto.MetricFamily, all bool) []series {
	var out []series
	for name, f := range fams {
		if !all && !strings.HasPrefix(name, "tensorwire_") {
			continue
		}
		typ := strings.ToLower(f.GetType().String())
		for _, m := range f.GetMetric() {
			s := series{Name: name, Type: typ}
			labels := slices.Clone(m.GetLabel())
			slices.SortStableFunc(labels, func(a, b *dto.LabelPair) int {
				return cmp.Or(labelRank(a.GetName())-labelRank(b.GetName()), strings.Compare(a.GetName(), b.GetName()))
			})
			var ls []string
			for _, l := range labels {
				if l.GetValue() == "" {
					continue // no label, to Prometheus (the name of a call that names no object)
				}
				if s.Labels == nil {
					s.Labels = map[string]string{}
				}
				s.Labels[l.GetName()] = l.GetValue()
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			s.labels = strings.Join(ls, " ")
			switch {
			case m.Counter != nil:
				s.Value = ptr(m.Counter.GetValue())
			case m.Gauge != nil:
				s.Value = ptr(m.Gauge.GetValue())
			case m.Untyped != nil:
				s.Value = ptr(m.Untyped.GetValue())
			case m.Histogram != nil:
				h := m.Histogram
				s.Count, s.Sum = ptr(h.GetSampleCount()), ptr(h.GetSampleSum())
				for _, b := range h.GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						s.Buckets = append(s.Buckets, bucket{b.GetUpperBound(), b.GetCumulativeCount()})
					}
				}
				s.P50, s.P99 = quantileBound(s.Buckets, *s.Count, 0.5), quantileBound(s.Buckets, *s.Count, 0.99)
			case m.Summary != nil:
				s.Count, s.Sum = ptr(m.Summary.GetSampleCount()), ptr(m.Summary.GetSampleSum())
			}
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b series) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.labels, b.labels))
	})
	return out
}

// labelRank orders a series' labels for a person: what is called (service,
// the served object's name, method), then the outcome (code), then the rest
// by name.
func labelRank(name string) int {
	if i := slices.Index([]string{"service", "name", "method", "code"}, name); i >= 0 {
		return i
	}
	return 4
}

func ptr[T any](v T) *T { return &v }

// quantileBound returns the upper bound of the first bucket whose
// cumulative count reaches q of count; nil without observations, or when
// only +Inf's bucket does.
func quantileBound(buckets []bucket, count uint64, q float64) *float64 {
	if count == 0 {
		return nil
	}
	need := uint64(math.Ceil(q * float64(count)))
	for _, b := range buckets {
		if b.Count >= need {
			return ptr(b.LE)
		}
	}
	return nil
}

// printSeries prints the table: a heading per group (rpc, replay, store,
// serve, loader, then go, process, ...), a row per series.
func printSeries(w io.Writer, ss []series) error {
	if len(ss) == 0 {
		_, err := fmt.Fprintln(w, "no tensorwire metrics (is it a node's --metrics address?)")
		return err
	}
	order := []string{"rpc", "replay", "store", "serve", "loader"}
	group := func(s series) (string, string) {
		rest := strings.TrimPrefix(s.Name, "tensorwire_")
		g, metric, ok := strings.Cut(rest, "_")
		if !ok {
			return rest, rest
		}
		return g, metric
	}
	rank := func(g string) int {
		if i := slices.Index(order, g); i >= 0 {
			return i
		}
		return len(order)
	}
	ss = slices.Clone(ss)
	slices.SortStableFunc(ss, func(a, b series) int {
		ga, _ := group(a)
		gb, _ := group(b)
		return cmp.Or(rank(ga)-rank(gb), strings.Compare(ga, gb))
	})
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	last := ""
	for _, s := range ss {
		g, metric := group(s)
		if g != last {
			// Lines without a tab end tabwriter's column block: each
			// group's columns are aligned on their own.
			if last != "" {
				fmt.Fprintln(tw)
			}
			fmt.Fprintln(tw, strings.ToUpper(g))
			last = g
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", metric, s.labels, formatValue(s))
	}
	return tw.Flush()
}

// formatValue writes a series' value for a person: integers exactly, bytes
// with a binary unit beside them, seconds in a duration's units, and a
// histogram as its count, mean and percentile bounds.
func formatValue(s series) string {
	seconds := strings.HasSuffix(s.Name, "_seconds") || strings.HasSuffix(s.Name, "_seconds_total")
	switch {
	case s.Value != nil && strings.HasSuffix(s.Name, "time_seconds"):
		// A time (process_start_time_seconds), not a duration.
		return time.Unix(0, int64(*s.Value*1e9)).UTC().Format(time.RFC3339)
	case s.Value != nil && seconds:
		return dur(*s.Value)
	case s.Value != nil && strings.Contains(s.Name, "_bytes"):
		return number(*s.Value) + bytesUnit(*s.Value)
	case s.Value != nil:
		return number(*s.Value)
	case s.Count != nil && *s.Count == 0:
		return "count 0"
	case s.Count != nil:
		out := "count " + strconv.FormatUint(*s.Count, 10)
		mean := *s.Sum / float64(*s.Count)
		if seconds {
			out += "  mean " + dur(mean)
		} else {
			out += "  mean " + number(mean)
		}
		for _, p := range []struct {
			name string
			v    *float64
		}{{"p50", s.P50}, {"p99", s.P99}} {
			switch {
			case p.v == nil && s.Buckets != nil:
				out += fmt.Sprintf("  %s > %s", p.name, dur(s.Buckets[len(s.Buckets)-1].LE))
			case p.v != nil && seconds:
				out += fmt.Sprintf("  %s <= %s", p.name, dur(*p.v))
			case p.v != nil:
				out += fmt.Sprintf("  %s <= %s", p.name, number(*p.v))
			}
		}
		return out
	}
	return ""
}

// number writes v as an integer when it is one, else with 4 significant
// digits.
func number(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// bytesUnit returns " (1.5 MiB)" for v bytes of 1 KiB or more, else "".
func bytesUnit(v float64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	if v < 1024 {
		return ""
	}
	u := -1
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	return fmt.Sprintf(" (%.1f %s)", v, units[u])
}

// dur writes seconds as a duration rounded to 3 significant digits.
func dur(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	case d >= time.Microsecond:
		return d.Round(10 * time.Nanosecond).String()
	}
	return d.String()
}
