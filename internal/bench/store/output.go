package store

import (
	"fmt"
	"io"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/report"
)

// results are the run's figures.
type results struct {
	started   time.Time
	broadcast []broadcastResult
	rollouts  rolloutsResult
	o         *options // the run's: the rollouts' items per call, calls in flight, language
	watch     watchResultAll
}

// The references the issue measured with tensorshare itself on this
// machine class (2026-11-24), and the goals set against them.
const (
	seedAppendsPerS   = 172  // tensorshare, 4 workers appending 28 KB items: 172-206 items/s
	goalAppendsFactor = 100  // at least 100x
	goalRefMs         = 5.0  // 10 MB to 4 workers by reference: under 5 ms
	goalBytesVsTCP    = 2.0  // by bytes within 2x of raw TCP
	goalWatchP99Ms    = 5.0  // watch p99 with 64 watchers
	seedBroadcast10MB = 96.0 // tensorshare, 10 MB to 4 workers, p50 96-220 ms
)

// Result is what --json writes: exactly the keys issue 14 specifies. A part
// not run (--parts) is left out.
type Result struct {
	// Broadcast has a row per mode, size and worker count run: the time
	// from the Publish call to the last worker holding the version, every
	// byte read and checked, over the versions every worker held. Mode
	// "tcp" rows are the raw TCP baseline.
	Broadcast []BroadcastResult `json:"broadcast"`
	Rollouts  *RolloutsResult   `json:"rollouts,omitempty"`
	Watch     *WatchResult      `json:"watch,omitempty"`
}

// BroadcastResult is one broadcast configuration.
type BroadcastResult struct {
	Mode    string  `json:"mode"` // "ref", "bytes" or "tcp"
	MB      int     `json:"mb"`   // the parameter set's size, MiB
	Workers int     `json:"workers"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
}

// RolloutsResult is the rollouts part: acknowledged appends per second
// over the appenders' run, the Append (or Extend) calls' latency, and acknowledged
// items never drained (Lost) or drained more than once (Dups).
type RolloutsResult struct {
	Workers   int     `json:"workers"`
	PerCall   int     `json:"items_per_call,omitempty"` // 0: Append (the keys); more: Extend
	Lang      string  `json:"writers_lang,omitempty"`   // "python" for Python workers; "": Go (the keys)
	ItemsPerS float64 `json:"items_per_s"`
	P50       float64 `json:"append_p50_ms"`
	P99       float64 `json:"append_p99_ms"`
	Lost      int     `json:"lost"`
	Dups      int     `json:"duplicated"`
}

// WatchResult is the watch part: the time from a Put call to each watcher
// holding its event.
type WatchResult struct {
	Watchers int     `json:"watchers"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
}

func (b broadcastResult) quantile(p float64) time.Duration {
	if len(b.latency) == 0 {
		return 0
	}
	return report.Percentile(b.latency, p)
}

func (r *results) json() Result {
	var out Result
	out.Broadcast = []BroadcastResult{}
	for _, b := range r.broadcast {
		out.Broadcast = append(out.Broadcast, BroadcastResult{Mode: b.mode, MB: b.mb, Workers: b.workers,
			P50: report.Ms(b.quantile(50)), P99: report.Ms(b.quantile(99))})
	}
	if ro := r.rollouts; ro.seconds > 0 {
		out.Rollouts = &RolloutsResult{Workers: appenders, PerCall: perCall(r.o.extend), Lang: lang(r.o.writersLang), ItemsPerS: float64(ro.acked) / ro.seconds,
			P50: report.Ms(ro.latency.Quantile(50)), P99: report.Ms(ro.latency.Quantile(99)), Lost: ro.lost, Dups: ro.dups}
	}
	if len(r.watch.latency) > 0 {
		s := r.watch.latency
		out.Watch = &WatchResult{Watchers: watchers, P50: report.Ms(report.Percentile(s, 50)), P99: report.Ms(report.Percentile(s, 99))}
	}
	return out
}

func (r *results) print(w io.Writer) error {
	j := r.json()
	if len(r.broadcast) > 0 {
		fmt.Fprintln(w, "Parameter broadcast: a version every 200 ms; time from the Publish call to the last worker holding it (every byte read, CRC checked)")
		t := report.NewTable("mode", "MB", "workers", "versions", "skipped", "p50 ms", "p99 ms", "publish p50 ms", "bad CRC")
		for i, b := range r.broadcast {
			jb := j.Broadcast[i]
			t.Row(b.mode, b.mb, b.workers, len(b.latency), b.skipped, jb.P50, jb.P99, report.Ms(b.publishP50), b.badCRC)
		}
		if _, err := t.WriteTo(w); err != nil {
			return err
		}
		fmt.Fprintln(w, "  skipped: versions some worker never held, being busy with an older one (WaitNewer returns the latest)")
	}
	if ro := j.Rollouts; ro != nil {
		how := "appending 28 KB items"
		if ro.PerCall > 1 {
			how = fmt.Sprintf("extending by %d items of 28 KB a call", ro.PerCall)
		}
		who := "workers"
		if ro.Lang == langPython {
			who = "Python workers (threads)"
		}
		fmt.Fprintf(w, "\nRollouts: %d %s %s, %d calls in flight each, while a trainer drains with Get\n", appenders, who, how, r.o.inflight)
		t := report.NewTable("items/s", "call p50 ms", "call p99 ms", "acknowledged", "drained", "Gets", "Get p50 ms", "lost", "duplicated", "bad CRC")
		t.Row(ro.ItemsPerS, ro.P50, ro.P99, r.rollouts.acked, r.rollouts.drained, r.rollouts.gets, report.Ms(r.rollouts.getP50),
			ro.Lost, ro.Dups, r.rollouts.badCRC)
		if _, err := t.WriteTo(w); err != nil {
			return err
		}
	}
	if wa := j.Watch; wa != nil {
		fmt.Fprintf(w, "\nWatch: %d watchers (each a client, %d to a process); a Put every 20 ms; time from the Put call to each watcher holding the event\n", watchers, watchersPer)
		t := report.NewTable("watchers", "puts", "events", "missed", "p50 ms", "p99 ms")
		t.Row(wa.Watchers, r.watch.puts, len(r.watch.latency), r.watch.missed, wa.P50, wa.P99)
		if _, err := t.WriteTo(w); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\nGoals (issue 14, against tensorshare measured on this machine class):")
	for _, b := range j.Broadcast {
		if b.Mode == modeRef && b.MB == 10 && b.Workers == 4 {
			fmt.Fprintf(w, "  10 MB to 4 workers by reference, p50 %.2f ms: goal under %.0f ms (tensorshare p50 %.0f-220 ms): %s\n",
				b.P50, goalRefMs, seedBroadcast10MB, met(b.P50 < goalRefMs))
		}
		if b.Mode != modeBytes {
			continue
		}
		for _, c := range j.Broadcast {
			if c.Mode == modeTCP && c.MB == b.MB && c.Workers == b.Workers && c.P50 > 0 {
				fmt.Fprintf(w, "  %d MB to %d workers by bytes, p50 %.1f ms against raw TCP %.1f ms: %.2fx, goal within %.0fx: %s\n",
					b.MB, b.Workers, b.P50, c.P50, b.P50/c.P50, goalBytesVsTCP, met(b.P50/c.P50 <= goalBytesVsTCP))
			}
		}
	}
	if ro := j.Rollouts; ro != nil {
		by := ""
		if ro.Lang == langPython {
			by = " in Python"
		}
		if ro.PerCall > 1 {
			by += fmt.Sprintf(" (by Extend, %d a call)", ro.PerCall)
		}
		fmt.Fprintf(w, "  appends from 4 workers%s, %.0f items/s: %.0fx tensorshare's %d, goal at least %dx: %s; lost %d, duplicated %d: %s\n",
			by, ro.ItemsPerS, ro.ItemsPerS/seedAppendsPerS, seedAppendsPerS, goalAppendsFactor,
			met(ro.ItemsPerS >= goalAppendsFactor*seedAppendsPerS), ro.Lost, ro.Dups, met(ro.Lost == 0 && ro.Dups == 0))
	}
	if wa := j.Watch; wa != nil {
		fmt.Fprintf(w, "  watch p99 with %d watchers %.2f ms, goal under %.0f ms: %s\n", wa.Watchers, wa.P99, goalWatchP99Ms, met(wa.P99 < goalWatchP99Ms))
	}
	return nil
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// lang is RolloutsResult.Lang for the workers' language: "" for Go.
func lang(l string) string {
	if l == langGo {
		return ""
	}
	return l
}

// perCall is RolloutsResult.PerCall for extend items per call.
func perCall(extend int) int {
	if extend <= 1 {
		return 0
	}
	return extend
}
