// Package gather is the gather benchmark, "tensorwire bench gather":
// memmap row gathers and scatters of 5 random rows of a 1.2 GB image
// dataset, warm and cold, against plain memory copies of the same bytes
// measured side by side in the same run, and a streaming pass over the
// whole dataset that shows the Go heap stays small. Every gathered row is
// checked against what was written.
//
//	tensorwire bench gather [--rows 1000] [--iters 50] [--dir DIR] [--json FILE] [--seed 1]
//
// docs/benchmarks.md, "Gather and scatter", says how it measures, how to
// read it and what its JSON holds (Result).
package gather

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/memmap"
)

const (
	batchRows  = 5   // rows per measured operation
	streamRows = 32  // rows per Gather when streaming
	maxAnon    = 256 // rows of the anonymous reference buffer, at most
)

var imageShape = []int{640, 640, 3}

// Benchmark is "tensorwire bench gather".
var Benchmark = bench.Benchmark{
	Name:    name,
	Summary: "memmap row gathers and scatters against memcpy, warm and cold, and the Go heap while streaming a dataset",
	Run:     Run,
}

const name = "gather"

type config struct {
	rows, iters int
	dir, json   string
	seed        uint64
}

// Run runs the benchmark as args say (its flags), with the table on
// env.Stdout and progress and logs (slog's default logger) on stderr; the
// package documentation says what it does. ctx ending stops it, and the
// dataset is removed before it returns. Rows that do not hold what was
// written fail it, after the figures are printed.
func Run(ctx context.Context, env bench.Env, args []string) (err error) {
	var cfg config
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.IntVar(&cfg.rows, "rows", 1000, "rows (640x640x3 images) in the dataset")
	fs.IntVar(&cfg.iters, "iters", 50, "measured iterations of every operation")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the dataset (default: the system temporary directory)")
	fs.StringVar(&cfg.json, "json", "", "also write the figures as JSON to this file")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed for the random row choices")
	if err := bench.Parse(name, fs, args, env.Stdout); err != nil {
		return err
	}
	if cfg.rows < batchRows || cfg.iters < 1 {
		return bench.Usagef("need --rows >= %d and --iters >= 1", batchRows)
	}
	defer context.AfterFunc(ctx, func() {
		slog.Warn("interrupted: removing the dataset (interrupt again to quit at once)", "cause", context.Cause(ctx))
	})()

	dir, err := os.MkdirTemp(cfg.dir, "tensorwire-gather-*")
	if err != nil {
		return fmt.Errorf("dataset directory: %w", err)
	}
	defer func() {
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = fmt.Errorf("removing the dataset: %w", rerr)
		}
	}()

	res, err := measure(ctx, cfg, filepath.Join(dir, "images.memmap"))
	if ctx.Err() != nil {
		return fmt.Errorf("stopped: %w", context.Cause(ctx))
	}
	if err != nil && res == nil {
		return err
	}
	res.print(env.Stdout)
	if cfg.json != "" {
		if jerr := report.WriteJSON(cfg.json, res.result()); jerr != nil {
			return jerr
		}
	}
	if err != nil { // a verification failure, reported with the figures
		return fmt.Errorf("verification failed: %w", err)
	}
	return nil
}

// op is one measured operation.
type op struct {
	name, key string
	anonKey   string         // the anon copy it compares to; "" for none
	lat       report.Latency // every iteration's time
}

type results struct {
	cfg                config
	rowBytes, anonRows int
	dataset            int
	fill, flush        time.Duration
	ops                []*op
	streamCold         float64 // GB/s
	streamWarm         float64
	heapPeak           uint64
	verified           bool
}

// measure creates and fills the dataset at path, then runs the interleaved
// measurements and the streaming passes. A verification failure returns the
// results so far with the error; any other error returns nil results.
func measure(ctx context.Context, cfg config, path string) (*results, error) {
	shape := append([]int{cfg.rows}, imageShape...)
	t, err := memmap.Create(path, memmap.Uint8, shape...)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	rs := t.RowBytes()
	res := &results{cfg: cfg, rowBytes: rs, dataset: t.NumBytes(), verified: true}
	slog.Info("created dataset", "path", path, "shape", shape, "bytes", t.NumBytes())

	// want[r] is the byte every element of row r holds.
	want := make([]byte, cfg.rows)
	start, last := time.Now(), time.Now()
	for r := range cfg.rows {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		want[r] = byte(1 + r%251)
		if err := t.Fill([]int{r}, want[r:r+1]); err != nil {
			return nil, err
		}
		if time.Since(last) >= time.Second || r == cfg.rows-1 {
			last = time.Now()
			done := int64(r+1) * int64(rs)
			slog.Info("filling", "rows", r+1, "total", cfg.rows,
				"pct", 100*(r+1)/cfg.rows, "GB/s", fmt.Sprintf("%.2f", report.GBps(done, time.Since(start))))
		}
	}
	res.fill = time.Since(start)
	slog.Info("flushing to disk", "bytes", t.NumBytes())
	start = time.Now()
	if err := t.Flush(); err != nil {
		return nil, err
	}
	res.flush = time.Since(start)
	slog.Info("flushed", "seconds", fmt.Sprintf("%.1f", res.flush.Seconds()))

	n := batchRows * rs
	res.anonRows = min(cfg.rows, maxAnon)
	anon, err := benchkit.Anon(res.anonRows * rs)
	if err != nil {
		return nil, err
	}
	defer benchkit.Free(anon)
	cacheFlush, err := benchkit.Anon(benchkit.CacheFlushBytes)
	if err != nil {
		return nil, err
	}
	defer benchkit.Free(cacheFlush)

	src, dst := benchkit.Touched(n), benchkit.Touched(n) // memcpy's buffers
	buf := benchkit.Touched(n)                           // every other op's heap side
	rows := make([]int, batchRows)
	rng := rand.New(rand.NewPCG(cfg.seed, 0x7e5))
	var fail error
	check := func(what string) {
		if err := verify(buf, rows, want, rs); err != nil && fail == nil {
			fail = fmt.Errorf("%s: %w", what, err)
		}
	}
	// newValues sets buf to fresh values for rows and records them in want.
	newValues := func(it int) {
		for i, r := range rows {
			want[r] = byte(1 + (r+it+1)%251)
			benchkit.Fill(buf[i*rs:(i+1)*rs], want[r])
		}
	}
	timed := func(f func() error) (time.Duration, error) {
		t0 := time.Now()
		err := f()
		return time.Since(t0), err
	}
	anonCopy := func(gather bool) func() error {
		return func() error {
			for i, r := range rows {
				if gather {
					copy(buf[i*rs:(i+1)*rs], anon[r*rs:(r+1)*rs])
				} else {
					copy(anon[r*rs:(r+1)*rs], buf[i*rs:(i+1)*rs])
				}
			}
			return nil
		}
	}
	gather := func() error { return t.Gather(buf, rows) }
	scatter := func() error { return t.Scatter(rows, buf) }

	memcpy := &op{name: "memcpy", key: "memcpy"}
	anonG := &op{name: "anon gather", key: "anon_gather"}
	anonS := &op{name: "anon scatter", key: "anon_scatter"}
	gw := &op{name: "gather warm", key: "gather_warm", anonKey: "anon_gather"}
	sw := &op{name: "scatter warm", key: "scatter_warm", anonKey: "anon_scatter"}
	gc := &op{name: "gather cold", key: "gather_cold", anonKey: "anon_gather"}
	sc := &op{name: "scatter cold", key: "scatter_cold", anonKey: "anon_scatter"}
	res.ops = []*op{memcpy, anonG, anonS, gw, sw, gc, sc}

	// warm runs f once untimed (faulting its pages in), flushes the CPU
	// cache, and times f again.
	warm := func(o *op, f func() error) error {
		if err := f(); err != nil {
			return err
		}
		benchkit.FlushCache(cacheFlush)
		d, err := timed(f)
		o.lat.Record(d)
		return err
	}
	cold := func(o *op, f func() error) error {
		if err := t.Evict(); err != nil {
			return err
		}
		d, err := timed(f)
		o.lat.Record(d)
		return err
	}

	slog.Info("measuring", "iters", cfg.iters, "batch_rows", batchRows, "batch_bytes", n)
	for it := range cfg.iters {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		copy(dst, src)
		d, _ := timed(func() error { copy(dst, src); return nil })
		memcpy.lat.Record(d)

		benchkit.PickRows(rng, res.anonRows, rows)
		warm(anonG, anonCopy(true))
		benchkit.PickRows(rng, res.anonRows, rows)
		warm(anonS, anonCopy(false))

		benchkit.PickRows(rng, cfg.rows, rows)
		if err := warm(gw, gather); err != nil {
			return nil, err
		}
		check("gather warm")

		benchkit.PickRows(rng, cfg.rows, rows)
		newValues(it)
		if err := warm(sw, scatter); err != nil {
			return nil, err
		}

		benchkit.PickRows(rng, cfg.rows, rows)
		if err := cold(gc, gather); err != nil {
			return nil, err
		}
		check("gather cold")

		benchkit.PickRows(rng, cfg.rows, rows)
		newValues(it + 1000)
		if err := cold(sc, scatter); err != nil {
			return nil, err
		}
	}

	slog.Info("streaming", "batch_rows", streamRows)
	if err := t.Evict(); err != nil {
		return nil, err
	}
	batch := make([]byte, min(streamRows, cfg.rows)*rs)
	for pass := range 2 {
		gbps, peak, err := stream(ctx, t, batch, want)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil && !errors.Is(err, benchkit.ErrMismatch) {
			return nil, err
		}
		if err != nil && fail == nil {
			fail = fmt.Errorf("streaming: %w", err)
		}
		res.heapPeak = max(res.heapPeak, peak)
		if pass == 0 {
			res.streamCold = gbps
		} else {
			res.streamWarm = gbps
		}
	}
	res.verified = fail == nil
	return res, fail
}

// stream gathers every row of t in order, len(batch)/RowBytes rows at a
// time, checks each row against want, and returns the throughput of the
// Gathers alone and the peak HeapInuse seen after each batch.
func stream(ctx context.Context, t *memmap.Tensor, batch, want []byte) (gbps float64, peak uint64, err error) {
	rs := t.RowBytes()
	per := len(batch) / rs
	var total time.Duration
	var ms runtime.MemStats
	var fail error
	rows := make([]int, 0, per)
	for first := 0; first < t.Len(); first += per {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		rows = rows[:0]
		for r := first; r < min(first+per, t.Len()); r++ {
			rows = append(rows, r)
		}
		b := batch[:len(rows)*rs]
		t0 := time.Now()
		if err := t.Gather(b, rows); err != nil {
			return 0, 0, err
		}
		total += time.Since(t0)
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
		if err := verify(b, rows, want, rs); err != nil && fail == nil {
			fail = err
		}
	}
	return report.GBps(int64(t.NumBytes()), total), peak, fail
}

// verify checks that row i of buf, for each rows[i] = r, holds want[r] in
// every byte.
func verify(buf []byte, rows []int, want []byte, rs int) error {
	for i, r := range rows {
		if err := benchkit.CheckRow(r, buf[i*rs:(i+1)*rs], want[r]); err != nil {
			return err
		}
	}
	return nil
}

func (res *results) p50(key string) time.Duration {
	for _, o := range res.ops {
		if o.key == key {
			return o.lat.Quantile(50)
		}
	}
	return 0
}

func ratio(ref, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(ref) / float64(d)
}

func (res *results) print(w io.Writer) {
	n := int64(batchRows * res.rowBytes)
	fmt.Fprintf(w, "%d random rows (%d bytes) of a [%d, 640, 640, 3] uint8 dataset (%d bytes), %d iterations\n\n",
		batchRows, n, res.cfg.rows, res.dataset, res.cfg.iters)
	tb := report.NewTable("op", "p50 ms", "p90 ms", "GB/s", "vs memcpy", "vs anon")
	tb.Prec = 3
	memcpy := res.p50("memcpy")
	for _, o := range res.ops {
		s := o.lat.Stats()
		var vsAnon any = ""
		if o.anonKey != "" {
			vsAnon = ratio(res.p50(o.anonKey), s.P50)
		}
		tb.Row(o.name, report.Ms(s.P50), report.Ms(s.P90), report.GBps(n, s.P50), ratio(memcpy, s.P50), vsAnon)
	}
	tb.WriteTo(w)

	fmt.Fprintf(w, "\nstreaming %d rows per Gather into one reused %d-byte buffer\n\n", streamRows, streamRows*res.rowBytes)
	st := report.NewTable("stream", "GB/s", "peak Go heap MB", "dataset MB")
	st.Row("cold (after Evict)", res.streamCold, float64(res.heapPeak)/1e6, float64(res.dataset)/1e6)
	st.Row("warm", res.streamWarm, "", "")
	st.WriteTo(w)
	if res.verified {
		fmt.Fprintln(w, "\nverified: every gathered and streamed row held the bytes last written")
	} else {
		fmt.Fprintln(w, "\nVERIFICATION FAILED: see stderr")
	}
}

// Result is the figures as the --json file has them. For each operation
// (memcpy, anon gather and scatter, gather and scatter warm and cold), the
// p50 and p90 of its iteration times in ms (HdrHistogram: to 3 significant
// digits) and its throughput at the p50 time (GB/s: 1e9 bytes per second);
// for every operation but memcpy, Ratio is memcpy's p50 over the
// operation's (its throughput as a fraction of memcpy's), and for the
// gathers and scatters of the dataset AnonRatio is the same against the anon
// copy in the same direction.
type Result struct {
	Rows         int    `json:"rows"`
	Iters        int    `json:"iters"`
	Seed         uint64 `json:"seed"`
	RowBytes     int    `json:"row_bytes"`
	BatchRows    int    `json:"batch_rows"`    // rows per operation
	BatchBytes   int64  `json:"batch_bytes"`   // bytes per operation
	DatasetBytes int    `json:"dataset_bytes"` // the dataset's size
	AnonRows     int    `json:"anon_rows"`     // rows of the anonymous reference buffer

	FillSeconds  float64 `json:"fill_seconds"`  // writing every row of the dataset
	FlushSeconds float64 `json:"flush_seconds"` // flushing it to disk

	MemcpyMsP50 float64 `json:"memcpy_ms_p50"`
	MemcpyMsP90 float64 `json:"memcpy_ms_p90"`
	MemcpyGBps  float64 `json:"memcpy_gbps"`

	AnonGatherMsP50  float64 `json:"anon_gather_ms_p50"`
	AnonGatherMsP90  float64 `json:"anon_gather_ms_p90"`
	AnonGatherGBps   float64 `json:"anon_gather_gbps"`
	AnonGatherRatio  float64 `json:"anon_gather_ratio"`
	AnonScatterMsP50 float64 `json:"anon_scatter_ms_p50"`
	AnonScatterMsP90 float64 `json:"anon_scatter_ms_p90"`
	AnonScatterGBps  float64 `json:"anon_scatter_gbps"`
	AnonScatterRatio float64 `json:"anon_scatter_ratio"`

	GatherWarmMsP50      float64 `json:"gather_warm_ms_p50"`
	GatherWarmMsP90      float64 `json:"gather_warm_ms_p90"`
	GatherWarmGBps       float64 `json:"gather_warm_gbps"`
	GatherWarmRatio      float64 `json:"gather_warm_ratio"`
	GatherWarmAnonRatio  float64 `json:"gather_warm_anon_ratio"`
	ScatterWarmMsP50     float64 `json:"scatter_warm_ms_p50"`
	ScatterWarmMsP90     float64 `json:"scatter_warm_ms_p90"`
	ScatterWarmGBps      float64 `json:"scatter_warm_gbps"`
	ScatterWarmRatio     float64 `json:"scatter_warm_ratio"`
	ScatterWarmAnonRatio float64 `json:"scatter_warm_anon_ratio"`
	GatherColdMsP50      float64 `json:"gather_cold_ms_p50"`
	GatherColdMsP90      float64 `json:"gather_cold_ms_p90"`
	GatherColdGBps       float64 `json:"gather_cold_gbps"`
	GatherColdRatio      float64 `json:"gather_cold_ratio"`
	GatherColdAnonRatio  float64 `json:"gather_cold_anon_ratio"`
	ScatterColdMsP50     float64 `json:"scatter_cold_ms_p50"`
	ScatterColdMsP90     float64 `json:"scatter_cold_ms_p90"`
	ScatterColdGBps      float64 `json:"scatter_cold_gbps"`
	ScatterColdRatio     float64 `json:"scatter_cold_ratio"`
	ScatterColdAnonRatio float64 `json:"scatter_cold_anon_ratio"`

	StreamBatchRows          int     `json:"stream_batch_rows"`
	StreamBatchBytes         int     `json:"stream_batch_bytes"`
	StreamColdGBps           float64 `json:"stream_cold_gbps"`             // after Evict: from the disk
	StreamWarmGBps           float64 `json:"stream_warm_gbps"`             // the second pass
	StreamHeapInusePeakBytes uint64  `json:"stream_heap_inuse_peak_bytes"` // over both passes
	// Verified is true when every gathered and streamed row held the bytes
	// last written.
	Verified bool `json:"verified"`
}

// opFigures are one operation's figures in Result.
type opFigures struct {
	msP50, msP90, gbps, ratio, anonRatio float64
}

func (res *results) op(key string) opFigures {
	n := int64(batchRows * res.rowBytes)
	for _, o := range res.ops {
		if o.key != key {
			continue
		}
		s := o.lat.Stats()
		f := opFigures{msP50: report.Ms(s.P50), msP90: report.Ms(s.P90), gbps: report.GBps(n, s.P50),
			ratio: ratio(res.p50("memcpy"), s.P50)}
		if o.anonKey != "" {
			f.anonRatio = ratio(res.p50(o.anonKey), s.P50)
		}
		return f
	}
	return opFigures{}
}

// result returns the figures as the JSON file has them.
func (res *results) result() Result {
	r := Result{
		Rows:                     res.cfg.rows,
		Iters:                    res.cfg.iters,
		Seed:                     res.cfg.seed,
		RowBytes:                 res.rowBytes,
		BatchRows:                batchRows,
		BatchBytes:               int64(batchRows * res.rowBytes),
		DatasetBytes:             res.dataset,
		AnonRows:                 res.anonRows,
		FillSeconds:              res.fill.Seconds(),
		FlushSeconds:             res.flush.Seconds(),
		StreamBatchRows:          streamRows,
		StreamBatchBytes:         streamRows * res.rowBytes,
		StreamColdGBps:           res.streamCold,
		StreamWarmGBps:           res.streamWarm,
		StreamHeapInusePeakBytes: res.heapPeak,
		Verified:                 res.verified,
	}
	m := res.op("memcpy")
	r.MemcpyMsP50, r.MemcpyMsP90, r.MemcpyGBps = m.msP50, m.msP90, m.gbps
	ag, as := res.op("anon_gather"), res.op("anon_scatter")
	r.AnonGatherMsP50, r.AnonGatherMsP90, r.AnonGatherGBps, r.AnonGatherRatio = ag.msP50, ag.msP90, ag.gbps, ag.ratio
	r.AnonScatterMsP50, r.AnonScatterMsP90, r.AnonScatterGBps, r.AnonScatterRatio = as.msP50, as.msP90, as.gbps, as.ratio
	gw, sw := res.op("gather_warm"), res.op("scatter_warm")
	r.GatherWarmMsP50, r.GatherWarmMsP90, r.GatherWarmGBps, r.GatherWarmRatio, r.GatherWarmAnonRatio =
		gw.msP50, gw.msP90, gw.gbps, gw.ratio, gw.anonRatio
	r.ScatterWarmMsP50, r.ScatterWarmMsP90, r.ScatterWarmGBps, r.ScatterWarmRatio, r.ScatterWarmAnonRatio =
		sw.msP50, sw.msP90, sw.gbps, sw.ratio, sw.anonRatio
	gc, sc := res.op("gather_cold"), res.op("scatter_cold")
	r.GatherColdMsP50, r.GatherColdMsP90, r.GatherColdGBps, r.GatherColdRatio, r.GatherColdAnonRatio =
		gc.msP50, gc.msP90, gc.gbps, gc.ratio, gc.anonRatio
	r.ScatterColdMsP50, r.ScatterColdMsP90, r.ScatterColdGBps, r.ScatterColdRatio, r.ScatterColdAnonRatio =
		sc.msP50, sc.msP90, sc.gbps, sc.ratio, sc.anonRatio
	return r
}
