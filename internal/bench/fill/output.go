package fill

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tensorwire/tensorwire/internal/report"
)

// The seed's PyTorch figures (p50, ms) and the goals.
const (
	seedRemoteFillMs = 99
	seedLocalFillMs  = 29
	goalDeltaMs      = 0.2 // remote_fill warm p50 - local_fill warm p50, at most
	goalVsSeed       = 20  // seed remote fill p50 / remote_fill warm p50, at least
)

type results struct {
	cfg          config
	rowBytes     int
	dataset      int
	node         string
	write, flush time.Duration
	workloads    []*workload
	resident     int
}

// temps are the temperatures, in the order they are printed.
var temps = []string{"warm", "hot", "cold"}

// times returns wl's call times at temperature temp.
func (wl *workload) times(temp string) []time.Duration {
	switch temp {
	case "warm":
		return wl.warm
	case "hot":
		return wl.hot
	}
	return wl.cold
}

// p50 returns the p50 in ms of workload key at temperature temp.
func (res *results) p50(key, temp string) float64 {
	for _, wl := range res.workloads {
		if wl.key == key {
			return report.Ms(report.Percentile(wl.times(temp), 50))
		}
	}
	return 0
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

func (res *results) print(w io.Writer) {
	n := batchRows * res.rowBytes
	fmt.Fprintf(w, "%d rows (%d bytes) per call of a [%d, 640, 640, 3] uint8 TensorDict (%d bytes) on a shared root;\n",
		batchRows, n, res.cfg.rows, res.dataset)
	fmt.Fprintf(w, "node B: %s; %d calls of each workload at each temperature\n\n", res.node, res.cfg.iters)
	tb := report.NewTable("workload", "call", "pages", "p50 ms", "p90 ms")
	tb.Prec = 3
	for _, wl := range res.workloads {
		what := wl.what
		for _, temp := range temps {
			if temp == "cold" && wl.noCold {
				continue
			}
			s := report.Summarize(wl.times(temp))
			tb.Row(wl.key, what, temp, report.Ms(s.P50), report.Ms(s.P90))
			what = ""
		}
	}
	tb.WriteTo(w)

	fmt.Fprintln(w)
	for _, temp := range []string{"warm", "hot"} {
		remote, local := res.p50("remote_fill", temp), res.p50("local_fill", temp)
		d := remote - local
		fmt.Fprintf(w, "remote - local   remote_fill_%[1]s_p50 - local_fill_%[1]s_p50 = %.3f - %.3f = %.3f ms   (goal: <= %.1f ms: %s)\n",
			temp, remote, local, d, goalDeltaMs, met(d <= goalDeltaMs))
	}
	fmt.Fprintf(w, "null call        a Describe round trip: warm %.3f ms, hot %.3f ms (the floor of remote - local)\n",
		res.p50("null_call", "warm"), res.p50("null_call", "hot"))
	vsSeed := ratio(seedRemoteFillMs, res.p50("remote_fill", "warm"))
	fmt.Fprintf(w, "vs seed          %d ms / remote_fill_warm_p50 = %.0fx   (goal: >= %dx: %s)\n",
		seedRemoteFillMs, vsSeed, goalVsSeed, met(vsSeed >= goalVsSeed))
	fmt.Fprintf(w, "                 %d ms / local_fill_warm_p50 = %.0fx\n", seedLocalFillMs, ratio(seedLocalFillMs, res.p50("local_fill", "warm")))
	fmt.Fprintf(w, "cold pages       at most %d of the %d pages of a cold call's rows were cached before it (0: cold was cold)\n",
		res.resident, (n+os.Getpagesize()-1)/os.Getpagesize())
	fmt.Fprintf(w, "verified         every call's result, then all %d rows of the dataset, held the values last written\n", res.cfg.rows)
}

func (res *results) json() map[string]any {
	n := batchRows * res.rowBytes
	m := map[string]any{
		"rows":                           res.cfg.rows,
		"iters":                          res.cfg.iters,
		"batch_rows":                     batchRows,
		"batch_bytes":                    n,
		"dataset_bytes":                  res.dataset,
		"shared_fs":                      true,
		"remote_minus_local_warm_ms_p50": res.p50("remote_fill", "warm") - res.p50("local_fill", "warm"),
		"remote_minus_local_hot_ms_p50":  res.p50("remote_fill", "hot") - res.p50("local_fill", "hot"),
		"seed_remote_fill_ms_p50":        seedRemoteFillMs,
		"seed_local_fill_ms_p50":         seedLocalFillMs,
		"remote_fill_vs_seed":            ratio(seedRemoteFillMs, res.p50("remote_fill", "warm")),
		"local_fill_vs_seed":             ratio(seedLocalFillMs, res.p50("local_fill", "warm")),
		"cold_resident_pages_max":        res.resident,
		"write_seconds":                  res.write.Seconds(),
		"flush_seconds":                  res.flush.Seconds(),
		"verified":                       true,
	}
	for _, wl := range res.workloads {
		for _, temp := range temps {
			if temp == "cold" && wl.noCold {
				continue
			}
			s := report.Summarize(wl.times(temp))
			m[wl.key+"_"+temp+"_ms_p50"] = report.Ms(s.P50)
			m[wl.key+"_"+temp+"_ms_p90"] = report.Ms(s.P90)
		}
	}
	return m
}
