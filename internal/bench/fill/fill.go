// Command fill measures the seed's benchmark: node A asks node B to fill 5
// rows of a 1.2 GB memory-mapped TensorDict that both map from a shared
// filesystem, against the same fill done locally, a read of the rows back
// from node B, and the same fill without a shared filesystem.
//
//	go run ./benchmarks/fill [--rows 1000] [--iters 50] [--dir DIR] [--json FILE]
//
// Node A is this process. It creates {"memmap": uint8 [rows, 640, 640, 3]}
// (1.2 GB for 1000 rows) in a new temporary folder under DIR (default: the
// system temporary directory), the shared root, writes row r with the byte
// 1+r%251 and flushes it to disk (so that cold calls read real blocks), and
// starts node B: this program re-executed as a child process serving the
// root as "tensorwire node" does, on loopback, with a random token. The
// folder is removed at exit, also on Ctrl-C or SIGTERM. Progress and logs
// go to stderr.
//
// # What it measures
//
// Every call works on 5 rows (6,144,000 bytes):
//
//	remote_fill  Client.Fill on node B, dialed with the shared root: only a
//	             reference crosses, node B writes its own mapping of the file
//	local_fill   TensorDict.Fill in this process on node A's mapping
//	remote_read  Client.Read of the rows from node B: the rows come back as
//	             bytes, into Go memory
//	bytes_fill   Client.Fill on node B from a client dialed without a root,
//	             as between nodes that share no filesystem: the rows go to
//	             node B and come back as bytes, and are written here
//	null_call    Client.Describe of the dataset: a round trip that touches
//	             no rows, the floor under every remote figure
//
// Each iteration runs every workload warm and hot, then every workload but
// null_call cold:
//
//	warm  the same call on the same rows ran just before, untimed; then the
//	      CPU caches were flushed (128 MiB read, about 10 ms), as after
//	      any real work, and node B sat idle meanwhile
//	hot   right after the warm call, one call untimed and the next timed,
//	      back to back: pages, caches and both processes' threads all warm
//	cold  node B dropped its page-table entries for the file (a
//	      benchmark-only method node B serves in addition to "tensorwire
//	      node"'s), node A evicted the file (memmap's Evict: msync, fsync,
//	      madvise, fadvise), and node A counted with mincore the rows'
//	      pages still in the page cache (reported as "cold pages", not
//	      enforced: tmpfs, for one, cannot drop them); the call then
//	      faults the evicted pages in from the disk
//
// Every warm and cold measurement takes the next of the disjoint row sets
// {4k..4k+3, rows-1-k} (the seed's [0, 1, 2, 3, 999], then
// [4, 5, 6, 7, 998], ...).
//
// Nothing is taken on trust: every fill writes a value its rows do not
// hold, and every timed fill is followed (untimed) by a check that every
// byte of its rows holds it, in node A's mapping; every read is checked
// against the values last written; at the end every row of the dataset is
// checked. A failure stops the program with status 1 and no figures.
//
// # How to read it
//
// The table gives the p50 and p90 (nearest rank) of each workload's call
// times at each temperature, in milliseconds. Below it:
//
//	remote - local   remote_fill p50 minus local_fill p50, warm and hot:
//	                 what asking node B costs over doing the fill here (the
//	                 goal is at most 0.2 ms); compare it with null_call,
//	                 the round trip alone
//	vs seed          the seed's PyTorch figure (p50 99 ms for the remote
//	                 fill, 29 ms for the local one) divided by ours, warm
//	                 (the goal for the remote fill is at least 20x)
//	cold pages       the most pages of a cold call's rows found in the page
//	                 cache just before it: 0 means cold calls were cold
//
// Compare the workloads with each other, measured in the same run; the
// seed's figures come from another machine, so "vs seed" is indicative.
// Warm and hot differ by what an idle process costs to wake: on a small
// virtual machine a loopback round trip between idle processes takes
// several times longer than between busy ones. Cold figures are dominated
// by reading the rows from the disk.
//
// # JSON
//
// With --json FILE the figures are written (atomically) to FILE as one
// object: for every workload K (remote_fill, local_fill, remote_read,
// bytes_fill, null_call) and temperature T (warm, hot, cold; null_call has
// no cold), K_T_ms_p50 and K_T_ms_p90; and rows, iters, batch_rows,
// batch_bytes, dataset_bytes, shared_fs, remote_minus_local_warm_ms_p50,
// remote_minus_local_hot_ms_p50, seed_remote_fill_ms_p50,
// seed_local_fill_ms_p50, remote_fill_vs_seed, local_fill_vs_seed,
// cold_resident_pages_max, write_seconds, flush_seconds and verified.
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
	"github.com/tensorwire/tensorwire/internal/benchkit"
	"github.com/tensorwire/tensorwire/internal/report"
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
	if b.bytesC, err = dial(ctx, node.Addr, false, rpc.WithToken(node.Token)); err != nil {
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
