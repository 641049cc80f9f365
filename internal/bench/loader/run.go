// Package loader is the loader benchmark, "tensorwire bench loader": one
// producer's batches shared by several training processes (consumers)
// against the same processes each running its own loader over the same
// dataset with the same transform, measured side by side in the same run.
//
// Two workloads, as issue 16 sets them:
//
//   - synthetic (tensorsocket's own benchmark): 16,000 samples of uint8
//     [3, 224, 224] (2.4 GB), each sample's index in its first and last 8
//     bytes and every other byte (7i+3) mod 256; consumers at batch 64 with
//     a simulated 5 ms training step, 1, 2 and 4 of them, one epoch, every
//     consumer checking every sample's bytes and that it saw each index
//     exactly once; and once with three consumers at batch 32, 64 and 128.
//   - fashion-mnist: Fashion-MNIST's 60,000 training images from Debian's
//     dataset-fashion-mnist (a synthetic set of that shape when it is not
//     installed), with the Augment transform (random crop with padding 4,
//     horizontal flip, normalize to float32), 4 consumers checking each
//     index exactly once.
//
// For each run: samples/s per consumer, the producer's CPU seconds, the CPU
// seconds of all processes over the epoch, the bytes each consumer read
// and wrote on its sockets per batch, and whether every consumer saw every
// sample exactly once.
//
//	tensorwire bench loader [--dataset synthetic,fashion-mnist] [--consumers 1,2,4] [--samples 16000] [--json FILE]
//
// docs/benchmarks.md, "Loader", says how it measures, how to read it and
// what its JSON holds (Result).
package loader

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/report"
)

// Benchmark is "tensorwire bench loader".
var Benchmark = bench.Benchmark{
	Name:    name,
	Summary: "one producer's batches shared by several consumer processes (tensorsocket's job) against each running its own loader: samples/s, CPU, bytes on the wire",
	Run:     Run,
}

const name = "loader"

// The workloads.
const (
	synthetic = "synthetic"
	fashion   = "fashion-mnist"
)

// The modes.
const (
	shared      = "shared"      // one producer node, consumers loader.Dial it
	independent = "independent" // every consumer runs loader.NewLocal
)

// options are the command line's flags.
type options struct {
	datasets  []string
	consumers []int // nil: each workload's own
	samples   int
	epochs    int
	fepochs   int // fashion-mnist's
	batch     int
	step      time.Duration
	fstep     time.Duration
	slots     int
	pbatch    int // synthetic
	fpbatch   int // fashion-mnist
	mixed     bool
	views     bool
	bytes     bool // shared consumers without a root: batches as bytes on the stream
	workers   int
	procs     int // GOMAXPROCS of each process of a run; 0: Go's default
	seed      uint64
	json      string
	dir       string
	data      string
	fashion   string
	profile   string
	rootDir   string

	// A child's.
	role      string
	addr      string
	root      string
	prefix    string
	mode      string
	check     string
	transform bool

	self []string

	producer string // "go" (a node's dataset producer) or "python" (runPython)
	python   string // the interpreter for --producer python
	device   string // --device: the Python run's GPU delivery ("" for none)
	source   string // --source: what makes the Python run's batches
	tsocket  string // --tensorsocket: auto, on or off
}

func newFlagSet(o *options, datasets, consumers *string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(datasets, "dataset", synthetic+","+fashion, "the workloads to run: "+synthetic+" (tensorsocket's, 2.4 GB), "+fashion)
	fs.StringVar(consumers, "consumers", "", "consumer counts to run (default: 1,2,4 for "+synthetic+", 4 for "+fashion+")")
	fs.IntVar(&o.samples, "samples", 16000, "samples of the synthetic dataset (150,528 bytes each); fewer make a quick run")
	fs.IntVar(&o.epochs, "epochs", 1, "epochs per run of "+synthetic+"; the figures are per epoch")
	fs.IntVar(&o.fepochs, "fashion-epochs", 5, "epochs per run of "+fashion+": its epoch takes about 0.1 CPU seconds, counted in the kernel's 10 ms ticks, so one epoch's CPU figure is a handful of ticks and goal (b) a toss of them")
	fs.IntVar(&o.batch, "batch", 64, "the consumers' batch size")
	fs.DurationVar(&o.step, "step", 5*time.Millisecond, "the simulated training step after each batch ("+synthetic+")")
	fs.DurationVar(&o.fstep, "fashion-step", 0, "the simulated training step after each batch ("+fashion+"): none by default, so that the CPU measured is the loading's")
	fs.IntVar(&o.slots, "slots", 16, "the producer's ring slots")
	fs.IntVar(&o.pbatch, "producer-batch", 64, "the producer's batch size for "+synthetic)
	fs.IntVar(&o.fpbatch, "fashion-producer-batch", 512, "the producer's batch size for "+fashion)
	fs.BoolVar(&o.views, "views", true, "shared consumers read their batches as views of the ring (loader.Options.Views) where a batch lies within a slot, instead of copying them")
	fs.BoolVar(&o.bytes, "bytes", false, "shared consumers ask for their batches as bytes on the stream (loader.Options.Bytes), as a job on a machine that does not share the producer's page cache gets them; views are then of the batches received")
	fs.IntVar(&o.procs, "procs", 0, "GOMAXPROCS of every process a run starts: the producer node, its consumers and the independent loaders alike (0: Go's default, the cores)")
	fs.IntVar(&o.workers, "workers", 1, "goroutines the "+fashion+" transform runs on (loader.Config.Workers), in the producer and in each independent loader")
	fs.BoolVar(&o.mixed, "mixed", true, "also run "+synthetic+" with three consumers at batch 32, 64 and 128")
	fs.Uint64Var(&o.seed, "seed", 1, "the shuffle's and the transform's seed")
	fs.StringVar(&o.json, "json", "", "also write the figures as JSON to this file")
	fs.StringVar(&o.dir, "dir", "", "directory for the run's files (default: the system temporary directory)")
	fs.StringVar(&o.data, "data", "", "keep the datasets in this directory and use them again (default: made for the run and removed)")
	fs.StringVar(&o.fashion, "fashion", "/usr/share/datasets/fashion-mnist", "Fashion-MNIST's IDX files")
	fs.StringVar(&o.rootDir, "root-dir", defaultRootDir(), "directory for the nodes' roots, where the producer's ring lives (default: /dev/shm when it is a writable tmpfs, so that the kernel writes no ring pages back to disk; else --dir)")
	fs.StringVar(&o.producer, "producer", "go", "go: the node's producer reads a TensorDict dataset with Go transforms; python: a tensorwire.loader.Producer over a torch DataLoader (tensorsocket's workload: 1,000 samples unless --samples, 4 consumers unless --consumers; python/tensorwire/_bench_loader.py)")
	fs.StringVar(&o.device, "device", "", "with --producer python: deliver the batches on this device (cuda:N; shm:N is the CPU stand-in): the producer puts each batch there once and the shared consumers get views of it, while each independent job copies its own batches there (docs/loader.md, \"GPU delivery\")")
	fs.StringVar(&o.source, "source", "transform", "with --producer python: what makes the batches: transform (a DataLoader with tensorsocket's transform), plain (the DataLoader without it) or premade (batches made once and handed out again: the delivery's figures alone)")
	fs.StringVar(&o.tsocket, "tensorsocket", "auto", "with --producer python: also run tensorsocket's TensorProducer and TensorConsumers over the same source, side by side: auto (when the interpreter imports tensorsocket), on or off")
	fs.StringVar(&o.python, "python", "", "with --producer python: the interpreter (default: python3, else /usr/bin/python3; it needs torch)")
	fs.StringVar(&o.profile, "cpuprofile", "", "write each process's CPU profile of its epoch under this prefix: PREFIX-RUN-ROLE.pprof")
	// The children's.
	fs.StringVar(&o.role, "role", "", "")
	fs.StringVar(&o.addr, "addr", "", "")
	fs.StringVar(&o.root, "root", "", "")
	fs.StringVar(&o.prefix, "prefix", "", "")
	fs.StringVar(&o.mode, "mode", "", "")
	fs.StringVar(&o.check, "check", "", "")
	fs.BoolVar(&o.transform, "transform", false, "")
	return fs
}

var hidden = []string{"role", "addr", "root", "prefix", "mode", "check", "transform"}

// Run runs the benchmark as args say (its flags), with the table on
// env.Stdout and progress on env.Stderr; the package documentation says
// what it does. It starts its processes with env.Self. ctx ending stops
// it, and what it made is removed before it returns. A consumer that does
// not see every sample exactly once fails it, after the figures are
// printed.
func Run(ctx context.Context, env bench.Env, args []string) error {
	var o options
	var datasets, consumers string
	fs := newFlagSet(&o, &datasets, &consumers)
	if err := bench.Parse(name, fs, args, env.Stdout, hidden...); err != nil {
		return err
	}
	o.self = env.Self
	switch o.role {
	case "":
	case "node":
		return runNode(o)
	case "consumer":
		return runConsumer(o)
	default:
		return bench.Usagef("unknown role %q", o.role)
	}
	for _, d := range strings.Split(datasets, ",") {
		if d != synthetic && d != fashion {
			return bench.Usagef("--dataset %q: want %s or %s", d, synthetic, fashion)
		}
		o.datasets = append(o.datasets, d)
	}
	if consumers != "" {
		for _, s := range strings.Split(consumers, ",") {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 64 {
				return bench.Usagef("--consumers %q: want counts from 1 to 64", consumers)
			}
			o.consumers = append(o.consumers, n)
		}
	}
	switch {
	case o.procs < 0:
		return bench.Usagef("--procs must be at least 0")
	case o.samples < 1 || o.epochs < 1 || o.fepochs < 1 || o.batch < 1 || o.slots < 1 || o.pbatch < 1 || o.fpbatch < 1 || o.workers < 1:
		return bench.Usagef("--samples, --epochs, --fashion-epochs, --batch, --slots, --workers and the producer batches must be at least 1")
	case o.step < 0 || o.fstep < 0:
		return bench.Usagef("--step and --fashion-step must not be negative")
	case o.batch > o.slots*o.pbatch || o.batch > o.slots*o.fpbatch || (o.mixed && 128 > o.slots*o.pbatch):
		return bench.Usagef("a consumer batch is larger than the ring (--slots × the producer batch)")
	}
	if o.producer != "python" {
		var set []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "device" || f.Name == "source" || f.Name == "tensorsocket" {
				set = append(set, "--"+f.Name)
			}
		})
		if len(set) > 0 {
			return bench.Usagef("%s: for --producer python only", strings.Join(set, ", "))
		}
	}
	if !slices.Contains([]string{"transform", "plain", "premade"}, o.source) {
		return bench.Usagef("--source %q: want transform, plain or premade", o.source)
	}
	if !slices.Contains([]string{"auto", "on", "off"}, o.tsocket) {
		return bench.Usagef("--tensorsocket %q: want auto, on or off", o.tsocket)
	}
	if o.procs > 0 && o.producer != "go" {
		return bench.Usagef("--procs is for Go runs (--producer go)")
	}
	switch o.producer {
	case "go":
	case "python":
		samplesSet := false
		fs.Visit(func(f *flag.Flag) { samplesSet = samplesSet || f.Name == "samples" })
		bin := "tensorwire"
		if len(env.Self) > 0 && env.Self[0] == "bench" { // this program is tensorwire: its node
			if exe, err := os.Executable(); err == nil {
				bin = exe
			}
		}
		return runPython(ctx, &o, o.python, bin, samplesSet, env.Stdout, env.Stderr)
	default:
		return bench.Usagef("--producer %q: want go or python", o.producer)
	}
	return runParent(ctx, &o, env.Stdout, env.Stderr)
}

// plan is one run: a workload, a mode, the consumers' batch sizes.
type plan struct {
	dataset string
	mode    string
	batches []int
}

// plans returns the runs, the modes of one count side by side.
func (o *options) plans() []plan {
	var ps []plan
	for _, d := range o.datasets {
		counts := o.consumers
		if counts == nil {
			counts = []int{1, 2, 4}
			if d == fashion {
				counts = []int{4}
			}
		}
		for _, n := range counts {
			for _, m := range []string{shared, independent} {
				ps = append(ps, plan{dataset: d, mode: m, batches: slices.Repeat([]int{o.batch}, n)})
			}
		}
		if d == synthetic && o.mixed && (o.consumers == nil || slices.Contains(o.consumers, 3)) {
			ps = append(ps, plan{dataset: d, mode: shared, batches: []int{32, 64, 128}})
		}
	}
	return ps
}

// runParent makes the datasets and runs every plan.
func runParent(ctx context.Context, o *options, stdout, stderr io.Writer) (err error) {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	work, err := os.MkdirTemp(o.dir, "tensorwire-bench-loader-*")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(work)) }()
	dataDir := o.data
	if dataDir == "" {
		dataDir = filepath.Join(work, "data")
	}
	res := Result{Date: time.Now().UTC().Format(time.RFC3339), Samples: map[string]int{}, Source: map[string]string{}}
	prefixes := map[string]string{}
	for _, d := range o.datasets {
		p, n, src, err := prepare(ctx, o, d, dataDir, log)
		if err != nil {
			return fmt.Errorf("%s dataset: %w", d, err)
		}
		prefixes[d], res.Samples[d], res.Source[d] = p, n, src
	}
	for i, p := range o.plans() {
		log.Info("run", "dataset", p.dataset, "mode", p.mode, "consumers", len(p.batches), "batches", p.batches)
		root, err := os.MkdirTemp(cmp.Or(o.rootDir, work), fmt.Sprint("tensorwire-bench-loader-root-", i, "-"))
		if err != nil {
			return err
		}
		r, err := runPlan(ctx, o, p, prefixes[p.dataset], res.Samples[p.dataset], root, stderr)
		os.RemoveAll(root)
		if err != nil {
			return fmt.Errorf("%s, %s, %d consumers: %w", p.dataset, p.mode, len(p.batches), err)
		}
		res.Runs = append(res.Runs, r)
	}
	printResult(stdout, o, &res)
	if o.json != "" {
		if err := report.WriteJSON(o.json, &res); err != nil {
			return err
		}
	}
	for _, r := range res.Runs {
		if !r.ExactlyOnce {
			return fmt.Errorf("%s, %s, %d consumers: a consumer did not see every sample exactly once: %s",
				r.Dataset, r.Mode, r.Consumers, r.Problem)
		}
	}
	return nil
}

// defaultRootDir returns /dev/shm if it is a directory this process may
// write, else "" (--dir).
func defaultRootDir() string {
	const shm = "/dev/shm"
	if fi, err := os.Stat(shm); err != nil || !fi.IsDir() {
		return ""
	}
	f, err := os.CreateTemp(shm, ".tensorwire-probe-*")
	if err != nil {
		return ""
	}
	f.Close()
	os.Remove(f.Name())
	return shm
}
