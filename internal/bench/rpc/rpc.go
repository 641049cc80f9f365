// Package rpc is the RPC benchmark, "tensorwire bench rpc": tensorwire's
// rpc package, grpc-go and a raw-TCP baseline on the same three workloads
// in the same run (16 callers of small calls, 6 MB requests, a 1 GiB
// stream), each system's server a child process that verifies what it
// receives.
//
//	tensorwire bench rpc [--systems tensorwire,grpc,tcp] [--duration 3s]
//	    [--bulk-iters 50] [--stream-bytes 1073741824] [--rounds 3] [--json FILE]
//
// docs/benchmarks.md, "RPC against grpc-go and raw TCP", says how it
// measures, how to read it and what its JSON holds. Adding a system is one
// file: a type implementing the system interface of system.go, registered
// with register in an init function.
package rpc

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
)

// Benchmark is "tensorwire bench rpc".
var Benchmark = bench.Benchmark{
	Name:    name,
	Summary: "tensorwire's rpc against grpc-go and raw TCP: small calls, 6 MB requests and a 1 GiB stream",
	Run:     Run,
}

const name = "rpc"

type config struct {
	systems     []string
	duration    time.Duration
	bulkIters   int
	streamBytes int64
	rounds      int // of the small and stream workloads, every system once a round
	json        string
	self        []string  // bench.Env.Self: re-executes this benchmark as a server
	stderr      io.Writer // bench.Env.Stderr: the servers' logs
}

// Run runs the benchmark as args say (its flags), with the table on
// env.Stdout and progress and logs (slog's default logger) on env.Stderr;
// the package documentation says what it does. It starts each system's
// server with env.Self and the hidden flags --serve NAME --listen ADDR,
// which make Run serve instead (serveChild). ctx ending stops it: the
// servers are stopped before it returns.
func Run(ctx context.Context, env bench.Env, args []string) error {
	cfg := config{self: env.Self, stderr: env.Stderr}
	var systems, serve, listen string
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&systems, "systems", strings.Join(registered(), ","), "comma-separated systems to compare")
	fs.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long the small workload runs per system")
	fs.IntVar(&cfg.bulkIters, "bulk-iters", 50, "timed bulk requests per system")
	fs.Int64Var(&cfg.streamBytes, "stream-bytes", 1<<30, "bytes of each stream")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds of the small and stream workloads, every system in turn in each")
	fs.StringVar(&cfg.json, "json", "", "also write the figures as JSON to this file")
	fs.StringVar(&serve, "serve", "", "internal: run as the server of this system")
	fs.StringVar(&listen, "listen", "127.0.0.1:0", "internal: the server's listening address")
	if err := bench.Parse(name, fs, args, env.Stdout, "serve", "listen"); err != nil {
		return err
	}
	if serve != "" {
		return serveChild(serve, listen, env.Stdout)
	}
	cfg.systems = strings.Split(systems, ",")
	if err := cfg.check(); err != nil {
		return err
	}
	defer context.AfterFunc(ctx, func() {
		slog.Warn("interrupted: stopping the servers (interrupt again to quit at once)", "cause", context.Cause(ctx))
	})()
	res, err := measure(ctx, cfg)
	if ctx.Err() != nil {
		return fmt.Errorf("stopped: %w", context.Cause(ctx))
	}
	if err != nil {
		return err
	}
	printResults(env.Stdout, cfg, res)
	if cfg.json != "" {
		return report.WriteJSON(cfg.json, newResult(res))
	}
	return nil
}

func (cfg *config) check() error {
	switch {
	case cfg.duration <= 0:
		return bench.Usagef("--duration must be positive")
	case cfg.bulkIters < 1:
		return bench.Usagef("--bulk-iters must be at least 1")
	case cfg.streamBytes < 1:
		return bench.Usagef("--stream-bytes must be at least 1")
	case cfg.rounds < 1:
		return bench.Usagef("--rounds must be at least 1")
	}
	for i, s := range cfg.systems {
		if _, ok := registry[s]; !ok {
			return bench.Usagef("unknown system %q (registered: %s)", s, strings.Join(registered(), ", "))
		}
		if slices.Contains(cfg.systems[:i], s) {
			return bench.Usagef("system %q given twice", s)
		}
	}
	return nil
}

// result is what one system measured.
type result struct {
	name        string
	small       smallResult
	bulk        report.Latency
	stream      time.Duration   // to stream streamBytes: the median round's
	streams     []time.Duration // every round's
	streamBytes int64
}

func (r *result) smallCallsPerS() float64 { return r.small.callsPerS() }
func (r *result) smallP50us() float64     { return us(r.small.lat.Quantile(50)) }
func (r *result) smallP99us() float64     { return us(r.small.lat.Quantile(99)) }
func (r *result) bulkP50ms() float64      { return report.Ms(r.bulk.Quantile(50)) }
func (r *result) bulkMBps() float64 {
	return report.GBps(bulkBytes, r.bulk.Quantile(50)) * 1e3
}
func (r *result) streamGBps() float64 { return report.GBps(r.streamBytes, r.stream) }

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// measure starts every system's server, connects a client to each, runs
// the workloads and stops the servers (also on errors).
func measure(ctx context.Context, cfg config) (results []*result, err error) {
	var (
		mu       sync.Mutex // children, for the interrupt
		children []*nodeproc.Proc
	)
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range children {
			if serr := c.Stop(); serr != nil && err == nil && ctx.Err() == nil {
				err = serr
			}
		}
	}()
	// On an interrupt, stopping the servers ends any call in flight: they
	// close their connections.
	defer context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range children {
			c.Stop()
		}
	})()

	var targets []target
	defer func() {
		for _, t := range targets {
			t.client.Close()
		}
	}()
	for _, name := range cfg.systems {
		c, err := startChild(ctx, cfg, name)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		children = append(children, c)
		mu.Unlock()
		slog.Info("server started", "system", name, "addr", c.Addr, "pid", c.Pid())
		cl, err := registry[name].dial(ctx, c.Addr)
		if err != nil {
			return nil, fmt.Errorf("%s: dial %s: %w", name, c.Addr, err)
		}
		targets = append(targets, target{name, cl})
		results = append(results, &result{name: name, streamBytes: cfg.streamBytes})
	}

	// The small and stream workloads run in rounds, every system once a
	// round, the order rotating: on a shared machine the load changes from
	// second to second, and rounds spread it over all systems alike.
	per := cfg.duration / time.Duration(cfg.rounds)
	for round := range cfg.rounds {
		for k := range targets {
			i := (k + round) % len(targets)
			t := targets[i]
			slog.Info("small", "system", t.name, "round", round+1, "callers", smallCallers, "duration", per)
			runtime.GC()
			r, err := runSmall(ctx, t.client, smallCallers, per)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t.name, err)
			}
			results[i].small.add(r)
			slog.Info("small done", "system", t.name, "round", round+1, "calls_per_s", math.Round(r.callsPerS()))
		}
	}

	slog.Info("bulk_request", "systems", len(targets), "bytes", bulkBytes, "iters", cfg.bulkIters, "warmup", bulkWarmup)
	runtime.GC()
	times, err := runBulk(ctx, targets, newBulkPayload(bulkBytes), bulkWarmup, cfg.bulkIters)
	if err != nil {
		return nil, err
	}
	for i, ts := range times {
		results[i].bulk = ts
		slog.Info("bulk_request done", "system", targets[i].name, "p50_ms", fmt.Sprintf("%.3f", results[i].bulkP50ms()))
	}

	for round := range cfg.rounds {
		for k := range targets {
			i := (k + round) % len(targets)
			t := targets[i]
			slog.Info("stream", "system", t.name, "round", round+1, "bytes", cfg.streamBytes, "msg_bytes", streamMsgSize)
			runtime.GC()
			d, err := runStream(ctx, t.client, cfg.streamBytes, streamMsgSize, round == 0)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t.name, err)
			}
			results[i].streams = append(results[i].streams, d)
			slog.Info("stream done", "system", t.name, "round", round+1, "GB_per_s", fmt.Sprintf("%.3f", report.GBps(cfg.streamBytes, d)))
		}
	}
	for _, r := range results {
		r.stream = median(r.streams)
	}
	return results, nil
}

// median returns the median of ds (the lower middle of an even count).
func median(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	return s[(len(s)-1)/2]
}

// find returns the result of the named system, or nil.
func find(results []*result, name string) *result {
	for _, r := range results {
		if r.name == name {
			return r
		}
	}
	return nil
}

// ratio returns v / ref(r) for the reference system's result, or "" (a
// blank cell) if it did not run.
func ratio(v float64, ref *result, f func(*result) float64) any {
	if ref == nil || f(ref) <= 0 {
		return ""
	}
	return v / f(ref)
}

func printResults(w io.Writer, cfg config, results []*result) {
	fmt.Fprintf(w, "small: %d callers, %d-byte requests and responses, %v in %d rounds; "+
		"bulk_request: %d bytes, p50 of %d; stream: %d bytes in %d-byte messages, median of %d rounds; GOMAXPROCS %d\n\n",
		smallCallers, smallSize, cfg.duration, cfg.rounds, bulkBytes, cfg.bulkIters, cfg.streamBytes, streamMsgSize, cfg.rounds, runtime.GOMAXPROCS(0))
	grpcRes, tcpRes := find(results, "grpc"), find(results, "tcp")
	tb := report.NewTable("system", "small calls/s", "p50 µs", "p99 µs", "bulk p50 ms", "bulk MB/s",
		"stream GB/s", "small vs grpc", "bulk vs tcp", "stream vs tcp")
	for _, r := range results {
		tb.Row(r.name, int64(math.Round(r.smallCallsPerS())), r.smallP50us(), r.smallP99us(),
			r.bulkP50ms(), r.bulkMBps(), r.streamGBps(),
			ratio(r.smallCallsPerS(), grpcRes, (*result).smallCallsPerS),
			ratio(r.bulkMBps(), tcpRes, (*result).bulkMBps),
			ratio(r.streamGBps(), tcpRes, (*result).streamGBps))
	}
	tb.WriteTo(w)
}

// Result is the figures as the --json file has them: an object per system
// that ran, under its name (tensorwire, grpc, tcp).
type Result map[string]SystemFigures

// SystemFigures are one system's figures.
type SystemFigures struct {
	Small  SmallFigures  `json:"small"`
	Bulk   BulkFigures   `json:"bulk_request"`
	Stream StreamFigures `json:"stream"`
}

// SmallFigures are the small workload's: calls per second, all callers
// together, over all rounds, and the p50 and p99 call latency in µs
// (HdrHistogram: to 3 significant digits).
type SmallFigures struct {
	CallsPerS float64 `json:"calls_per_s"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
}

// BulkFigures are the bulk workload's: the p50 time of a 6,144,000-byte
// request in ms, and that size over it in MB/s (1e6 bytes).
type BulkFigures struct {
	P50ms  float64 `json:"p50_ms"`
	MBperS float64 `json:"MB_per_s"`
}

// StreamFigures are the stream workload's: GB/s (1e9 bytes) over the whole
// stream, acknowledgement included, of the median of the rounds.
type StreamFigures struct {
	GBperS float64 `json:"GB_per_s"`
}

// newResult returns the figures as the JSON file has them.
func newResult(results []*result) Result {
	m := Result{}
	for _, r := range results {
		m[r.name] = SystemFigures{
			Small:  SmallFigures{r.smallCallsPerS(), r.smallP50us(), r.smallP99us()},
			Bulk:   BulkFigures{r.bulkP50ms(), r.bulkMBps()},
			Stream: StreamFigures{r.streamGBps()},
		}
	}
	return m
}
