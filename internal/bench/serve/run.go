package serve

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
)

// Benchmark is "tensorwire bench serve".
var Benchmark = bench.Benchmark{
	Name: name,
	Summary: "serving: client processes in closed loops of single-row predictions on a node batching them onto an MLP " +
		"and a calibrated fake model; requests/s, p50/p99, batch sizes, CPU per request, against batching off and " +
		"the model's in-process limit",
	Run: Run,
}

const name = "serve"

var usagef = bench.Usagef

// The client modes: how the clients dial the model.
const (
	modeRef   = "ref"   // serve.WithRoot(root): rows in slots the node maps
	modeBytes = "bytes" // serve.WithBytes(): rows with the calls
)

// The roles of the processes of a run.
const (
	roleNode   = "node"
	roleClient = "client"
)

// options are the command line's flags.
type options struct {
	clients     []int
	models      []string
	maxBatch    int
	replicas    int
	duration    time.Duration
	limitDur    time.Duration
	mode        string
	clientProcs int
	updateMB    int
	updateEvery time.Duration
	json        string
	root        string
	verbose     bool
	pythonExe   string        // the Python of Python replicas (python.go)
	device      string        // the torch device of Python replicas' modules (python.go)
	window      int           // the batches each Python replica takes in flight (Replica's window)
	maxDelay    time.Duration // the batching runs' policy: serve.MaxDelay (0: Greedy)
	clientLang  string        // the client processes' language: go, or python (tensorwire.serve.Client)
	inFlight    int           // the predictions each client process keeps in flight
	replicaKind string        // --replica
	pyPath      string        // the extracted Python client (python.go)
	nodeProfile string        // --profile: CPU profiles of each run's node and first client, to this prefix
	profileTo   string        // --profile-to: a role's CPU profile

	role   string
	child  bool
	addr   string
	model  string
	seed   uint64
	update bool // node role: load parameters every updateEvery

	self []string // bench.Env.Self: re-executes this benchmark for a role
}

func newFlagSet(o *options, clients, models *string) *flag.FlagSet {
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(clients, "clients", "1,8,32,128", "the client process counts to run, in order")
	fs.StringVar(models, "model", modelMLP+","+modelFake, "the models to run: "+modelMLP+" (64 -> 256 -> 16), "+modelFake+" (sleeps 1 ms + 5 us per row), "+
		modelPyMLP+", "+modelPyNull+" and "+modelPyBig+" (the MLP, a null module and an MLP 64 -> 1024 x3 -> 16 in torch, in Python replica processes on --device)")
	fs.StringVar(&o.replicaKind, "replica", "go", "go, or python: the same as --model "+modelMLP+","+modelPyMLP+","+modelPyNull+" (the Go MLP, side by side with Python replicas)")
	fs.StringVar(&o.device, "device", "cpu", "the torch device of the Python replicas' modules and of their in-process limit: cpu or cuda:N")
	fs.StringVar(&o.pythonExe, "python", "", "the Python of Python replicas, with torch, numpy and msgpack (default: the first of python3 and /usr/bin/python3 that has them; this build's client is put on its PYTHONPATH)")
	fs.IntVar(&o.window, "window", 1, "the batches each Python replica takes in flight, 1 to 4 (tensorwire.serve.Replica's window: the node\n"+
		"sends the next while the replica runs one)")
	fs.IntVar(&o.maxBatch, "max-batch", 16, "the max batch of the batching runs (the others have 1)")
	fs.DurationVar(&o.maxDelay, "max-delay", 0, "the batching runs' policy: a free replica waits up to this long after a batch's first\n"+
		"request for more (serve.MaxDelay; 0: greedy, torch_spread's)")
	fs.IntVar(&o.replicas, "replicas", 1, "the model's replicas on the node")
	fs.StringVar(&o.clientLang, "client-lang", "go", "the client processes: go (serve.Client), or python (tensorwire.serve.Client, its\n"+
		"predict() in a loop: by bell in ref mode on Linux x86-64, else by call; needs --python's numpy and msgpack)")
	fs.IntVar(&o.inFlight, "in-flight", 1, "the predictions each client process keeps in flight, 1 to 256: 1 is a loop of predict, as torch_spread's\n"+
		"clients do; N is N goroutines of Predict in a Go client, N asyncio tasks awaiting apredict in a Python one (actors in one process)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "how long each run's timed phase lasts")
	fs.DurationVar(&o.limitDur, "limit-duration", 2*time.Second, "how long the in-process limit is measured, per model")
	fs.IntVar(&o.clientProcs, "client-procs", 1, "GOMAXPROCS of each client process (0: Go's default, the cores): one is what a\n"+
		"worker loop needs, and many processes with several Ps each spin for work the cores do not have")
	fs.StringVar(&o.mode, "mode", modeRef, "how clients send their rows: "+modeRef+" (slots shared with the node) or "+modeBytes)
	fs.IntVar(&o.updateMB, "update-mb", 50, "the weight-update run: MiB of parameters the fake model loads (0: no such run)")
	fs.DurationVar(&o.updateEvery, "update-every", 500*time.Millisecond, "the weight-update run: how often the node loads them")
	fs.StringVar(&o.json, "json", "", "also write the figures as JSON to this file")
	fs.StringVar(&o.nodeProfile, "profile", "", "write CPU profiles (pprof) of each run's node and of its first client to\n"+
		"PREFIX-MODEL-CLIENTS-MAXBATCH-{node,client}.pprof (their whole lives: start, warm-up and the timed window; not the weight-update run);\n"+
		"with a Python model, also its first replica's cProfile report to PREFIX-MODEL-CLIENTS-MAXBATCH-replica.txt")
	fs.StringVar(&o.profileTo, "profile-to", "", "internal: node and client roles: write a CPU profile to this file")
	fs.StringVar(&o.root, "root", "", "the shared root: the run makes its folder under it (default: the system temporary directory); "+
		"roles: this host's view of it")
	fs.BoolVar(&o.verbose, "v", false, "print every process's logs on stderr (default: warnings and errors only)")
	fs.StringVar(&o.role, "role", "", "internal: run one process of the run: node or client")
	fs.BoolVar(&o.child, "child", false, "internal: started by the parent")
	fs.StringVar(&o.addr, "addr", "", "internal: client role: the node's address")
	fs.StringVar(&o.model, "run-model", "", "internal: node role: the model")
	fs.Uint64Var(&o.seed, "seed", 1, "internal: client role: the seed of its rows")
	fs.BoolVar(&o.update, "update", false, "internal: node role: load parameters of --update-mb every --update-every")
	return fs
}

// maxInFlight is --in-flight's most: the streams a node accepts from one
// connection (docs/protocol.md).
const maxInFlight = 256

// hidden are the flags of the roles, which usage leaves out.
var hidden = []string{"role", "child", "addr", "run-model", "seed", "update", "profile-to"}

// Run runs the benchmark as args say (its flags), with results on
// env.Stdout and progress and logs on env.Stderr; the package documentation
// says what it does. It starts its processes with env.Self. ctx ending
// stops it: the processes it started are stopped and its files removed
// before it returns. Errors that a different command line fixes match
// bench.ErrUsage; "-h" prints the flags to env.Stdout and returns
// flag.ErrHelp.
func Run(ctx context.Context, env bench.Env, args []string) error {
	var o options
	var clients, models string
	fs := newFlagSet(&o, &clients, &models)
	if err := bench.Parse(name, fs, args, env.Stdout, hidden...); err != nil {
		return err
	}
	o.self = env.Self
	switch o.replicaKind {
	case "go":
	case "python":
		models = modelMLP + "," + modelPyMLP + "," + modelPyNull
	default:
		return usagef("--replica: %q; want go or python", o.replicaKind)
	}
	if err := o.parseLists(clients, models); err != nil {
		return err
	}
	if err := o.check(); err != nil {
		return err
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	stderr := &lockedWriter{w: env.Stderr}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	switch o.role {
	case roleNode:
		return runNode(ctx, &o, env.Stdout, log.With("role", roleNode, "pid", os.Getpid()))
	case roleClient:
		return runClient(ctx, &o, env.Stdout, log.With("role", roleClient, "pid", os.Getpid()))
	}
	return runParent(ctx, &o, env.Stdout, stderr, log)
}

func (o *options) parseLists(clients, models string) error {
	for _, s := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return usagef("--clients: %q is not a count of at least 1", s)
		}
		if slices.Contains(o.clients, n) {
			return usagef("--clients: %d given twice", n)
		}
		o.clients = append(o.clients, n)
	}
	for _, m := range strings.Split(models, ",") {
		m = strings.TrimSpace(m)
		if m != modelMLP && m != modelFake && !isPython(m) {
			return usagef("--model: unknown model %q (want %s, %s, %s, %s or %s)", m, modelMLP, modelFake, modelPyMLP, modelPyNull, modelPyBig)
		}
		if slices.Contains(o.models, m) {
			return usagef("--model: %s given twice", m)
		}
		o.models = append(o.models, m)
	}
	return nil
}

// check validates the options.
func (o *options) check() error {
	switch {
	case o.maxBatch < 1:
		return usagef("--max-batch must be at least 1")
	case o.replicas < 1:
		return usagef("--replicas must be at least 1")
	case o.duration <= 0:
		return usagef("--duration must be positive")
	case o.limitDur <= 0:
		return usagef("--limit-duration must be positive")
	case o.mode != modeRef && o.mode != modeBytes:
		return usagef("--mode: unknown mode %q (want %s or %s)", o.mode, modeRef, modeBytes)
	case o.clientProcs < 0:
		return usagef("--client-procs must be at least 0")
	case o.updateMB < 0:
		return usagef("--update-mb must be at least 0")
	case o.updateEvery <= 0:
		return usagef("--update-every must be positive")
	case o.device != "cpu" && o.device != "cuda" && !strings.HasPrefix(o.device, "cuda:"):
		return usagef("--device: %q; want cpu or cuda:N", o.device)
	case o.window < 1 || o.window > 4:
		return usagef("--window: %d; want 1 to 4", o.window)
	case o.maxDelay < 0:
		return usagef("--max-delay: %v; want 0 (greedy) or more", o.maxDelay)
	case o.clientLang != "go" && o.clientLang != "python":
		return usagef("--client-lang: %q; want go or python", o.clientLang)
	case o.inFlight < 1 || o.inFlight > maxInFlight:
		return usagef("--in-flight: %d; want 1 to %d (the streams a node takes from one connection)", o.inFlight, maxInFlight)
	}
	switch o.role {
	case "", roleNode:
	case roleClient:
		if o.addr == "" {
			return usagef("the client role needs --addr")
		}
	default:
		return usagef("--role: unknown role %q (want node or client)", o.role)
	}
	return nil
}

// lockedWriter serializes the writes of the goroutines that share it.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
