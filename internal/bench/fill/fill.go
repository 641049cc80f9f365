// Package fill is the seed's remote-fill benchmark, "tensorwire bench
// fill": node A (this process) asks node B (a child process serving a
// shared root, as "tensorwire node" does) to fill 5 rows of a 1.2 GB
// memory-mapped TensorDict both map, against the same fill done locally, a
// read of the rows back, the same fill without a shared filesystem, and a
// call that touches no rows; warm, hot and cold. Every call's result is
// checked.
//
//	tensorwire bench fill [--rows 1000] [--iters 50] [--dir DIR] [--json FILE]
//
// docs/benchmarks.md, "The seed's remote fill", says how it measures, how
// to read it and what its JSON holds (Result).
package fill

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

var imageShape = []int{640, 640, 3}

// Benchmark is "tensorwire bench fill".
var Benchmark = bench.Benchmark{
	Name: name,
	Summary: "the seed's remote fill: node B fills 5 rows of a 1.2 GB dataset both map, by reference and by bytes, " +
		"against the same fill done locally; warm, hot and cold",
	Run: Run,
}

const name = "fill"

type config struct {
	rows, iters int
	dir, json   string
	self        []string  // bench.Env.Self: re-executes this benchmark as node B
	stderr      io.Writer // bench.Env.Stderr: progress
}

// nodeB holds the hidden flags with which Run runs node B, in a child
// process (startNodeB).
type nodeB struct {
	run                     bool
	listen, root, tokenFile string
}

// Run runs the benchmark as args say (its flags), with the figures on
// env.Stdout and progress and logs (slog's default logger) on env.Stderr;
// the package documentation says what it does. It starts node B with
// env.Self. ctx ending stops it: node B is stopped and the dataset removed
// before it returns.
func Run(ctx context.Context, env bench.Env, args []string) (err error) {
	cfg := config{self: env.Self, stderr: env.Stderr}
	var node nodeB
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.IntVar(&cfg.rows, "rows", 1000, "rows (640x640x3 images) of the dataset")
	fs.IntVar(&cfg.iters, "iters", 50, "measured calls of every workload at each temperature")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the shared root (default: the system temporary directory)")
	fs.StringVar(&cfg.json, "json", "", "also write the figures as JSON to this file")
	fs.BoolVar(&node.run, "node-b", false, "internal: run as node B")
	fs.StringVar(&node.listen, "listen", "127.0.0.1:0", "internal: node B's address")
	fs.StringVar(&node.root, "root", "", "internal: node B's root")
	fs.StringVar(&node.tokenFile, "token-file", "", "internal: node B's token file")
	if err := bench.Parse(name, fs, args, env.Stdout, "node-b", "listen", "root", "token-file"); err != nil {
		return err
	}
	if node.run {
		return node.serve(env.Stdout)
	}
	if cfg.rows < 2*batchRows || cfg.iters < 1 {
		return bench.Usagef("need --rows >= %d and --iters >= 1", 2*batchRows)
	}
	if cfg.iters < 30 {
		slog.Warn("fewer than 30 iterations: the p90 is one of the few slowest calls", "iters", cfg.iters)
	}
	defer context.AfterFunc(ctx, func() {
		slog.Warn("interrupted: stopping node B and removing the dataset (interrupt again to quit at once)",
			"cause", context.Cause(ctx))
	})()

	root, err := os.MkdirTemp(cfg.dir, "tensorwire-fill-*")
	if err != nil {
		return fmt.Errorf("shared root: %w", err)
	}
	defer func() {
		if rerr := os.RemoveAll(root); rerr != nil && err == nil {
			err = fmt.Errorf("removing the shared root: %w", rerr)
		}
	}()
	res, err := setupAndMeasure(ctx, cfg, root)
	if ctx.Err() != nil {
		return fmt.Errorf("stopped: %w", context.Cause(ctx))
	}
	if err != nil {
		return err
	}
	res.print(env.Stdout)
	if cfg.json != "" {
		return report.WriteJSON(cfg.json, res.result())
	}
	return nil
}

// setupAndMeasure creates the dataset under root, starts node B, dials it
// both ways, measures and checks.
func setupAndMeasure(ctx context.Context, cfg config, root string) (res *results, err error) {
	prefix := filepath.Join(root, "images")
	shape := append([]int{cfg.rows}, imageShape...)
	td, err := tensordict.Create(prefix, []int{cfg.rows}, tensordict.Field{Key: []string{"memmap"}, DType: memmap.Uint8, Shape: shape})
	if err != nil {
		return nil, err
	}
	defer td.Close()
	b := &nodeA{td: td, rel: "images", want: make([]byte, cfg.rows), stderr: cfg.stderr}
	if b.x, err = td.Tensor("memmap"); err != nil {
		return nil, err
	}
	b.mm, _ = b.x.Mapping()
	if b.data, err = b.mm.Bytes(); err != nil {
		return nil, err
	}
	b.rowBytes = b.x.RowBytes()
	b.row = make([]byte, b.rowBytes)
	slog.Info("created the dataset", "prefix", prefix, "shape", shape, "bytes", td.NumBytes())

	res = &results{cfg: cfg, rowBytes: b.rowBytes, dataset: td.NumBytes()}
	res.wake, res.wakeLine = benchkit.WakeReference()
	if res.write, res.flush, err = b.prewrite(ctx); err != nil {
		return nil, err
	}

	node, err := startNodeB(ctx, cfg.self, root)
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := node.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	res.node = fmt.Sprintf("pid %d on %s", node.Pid(), node.Addr)
	slog.Info("node B listening", "pid", node.Pid(), "addr", node.Addr)
	if b.shared, err = dial(ctx, node.Addr, true, rpc.WithRoot(root), rpc.WithToken(node.Token)); err != nil {
		return nil, err
	}
	defer b.shared.Close()
	// Compression off: the seed's constant rows would shrink to nothing,
	// and bytes_fill measures moving the rows' bytes.
	if b.bytesC, err = dial(ctx, node.Addr, false, rpc.WithToken(node.Token), rpc.WithCompression(false)); err != nil {
		return nil, err
	}
	defer b.bytesC.Close()

	if b.cacheFlush, err = benchkit.Anon(benchkit.CacheFlushBytes); err != nil {
		return nil, err
	}
	defer benchkit.Free(b.cacheFlush)

	ws := b.workloads()
	slog.Info("measuring", "iters", cfg.iters, "batch_rows", batchRows, "batch_bytes", batchRows*b.rowBytes)
	if err := b.measure(ctx, ws, cfg.iters); err != nil {
		return nil, err
	}
	if err := b.checkAll(ctx); err != nil {
		return nil, err
	}
	res.workloads, res.resident = ws, b.resident
	return res, nil
}

// dial connects to node B and checks that the link is shared or not, as
// wanted.
func dial(ctx context.Context, addr string, wantShared bool, opts ...rpc.Option) (*rpc.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(dctx, addr, opts...)
	if err != nil {
		return nil, err
	}
	shared, err := c.SharedFS(dctx)
	if err == nil && shared != wantShared {
		err = errors.New("the link to node B does not share the filesystem as it should")
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("shared_fs %v, want %v: %w", shared, wantShared, err)
	}
	return c, nil
}
