package replay

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
)

// Benchmark is "tensorwire bench replay".
var Benchmark = bench.Benchmark{
	Name: name,
	Summary: "the distributed replay buffer: a node, writers and a trainer, each a process, with rows in the shared " +
		"storage (ref) and with the calls (bytes); inserts/s, samples/s, latencies, the node's heap, torn rows",
	Run: Run,
}

const name = "replay"

var usagef = bench.Usagef

// The modes: how writers and the trainer dial the buffer.
const (
	modeRef   = "ref"   // replay.WithRoot(root): rows stay in the shared storage
	modeBytes = "bytes" // replay.WithRoot(root), replay.WithBytes(): rows travel with the calls
)

// options are the command line's flags.
type options struct {
	duration    time.Duration
	writers     int
	capacity    int
	batch       int
	sampleBatch int
	prefetch    bool
	insertRate  float64
	minSize     int
	modes       []string
	json        string
	root        string
	tokenFile   string

	role           string
	listen         string
	addr           string
	name           string
	mode           string
	memcpyDuration time.Duration
	child          bool
	verbose        bool
	logFile        string

	self []string // bench.Env.Self: re-executes this benchmark for a role

	// The languages of the trainer and the writers (langGo, langPython),
	// and the interpreter of the Python ones.
	trainerLang string
	writersLang string
	python      string
}

// The languages a trainer or the writers can be written in: Go
// (replay.Client, this program) or Python (the tensorwire package in
// python/, over numpy).
const (
	langGo     = "go"
	langPython = "python"
)

// pythonRun reports whether a Python role takes part, which makes every
// mode run twice: all in Go, then with the Python roles.
func (o *options) pythonRun() bool { return o.trainerLang == langPython || o.writersLang == langPython }

func newFlagSet(o *options, modes *string) *flag.FlagSet {
	fs := flag.NewFlagSet("bench replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "how long the timed phase of each mode runs (buffer role: of the run)")
	fs.IntVar(&o.writers, "writers", 2, "writer processes (buffer role: how many to wait for)")
	fs.IntVar(&o.capacity, "capacity", 50000, "transitions the buffer holds (28,237 bytes each)")
	fs.IntVar(&o.batch, "batch", 64, "transitions per Extend (writers)")
	fs.IntVar(&o.sampleBatch, "sample-batch", 256, "transitions per SampleInto (trainer)")
	fs.Float64Var(&o.insertRate, "insert-rate", 0, "writers: transitions per second, all writers together, in the timed phase (0: as fast as they can)")
	fs.BoolVar(&o.prefetch, "prefetch", true, "trainer: ask for the next sample's picks while gathering this one's rows (replay.WithPrefetch; ref mode)")
	fs.IntVar(&o.minSize, "min-size", 1000, "the rate limiter's MinSize: sampling waits for this many transitions")
	fs.StringVar(modes, "modes", modeRef+","+modeBytes, "the modes to run, in order: "+modeRef+" (rows in the shared storage), "+modeBytes+" (rows with the calls)")
	fs.StringVar(&o.json, "json", "", "also write the figures as JSON to this file")
	fs.StringVar(&o.root, "root", "", "the shared root: the run makes its folder under it (default: the system temporary directory); "+
		"roles: the node's root (buffer), this host's view of it (writer, trainer)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the shared secret of the node (default: a random one per run)")
	fs.StringVar(&o.role, "role", "", "run one process of the run: buffer, writer or trainer (default: run them all here)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "buffer role: TCP address to listen on, HOST:PORT")
	fs.StringVar(&o.addr, "addr", "", "writer and trainer roles: the buffer node's address, HOST:PORT")
	fs.StringVar(&o.name, "name", "replaybench", "roles: the buffer's name, and its folder under the root")
	fs.StringVar(&o.mode, "mode", modeRef, "writer and trainer roles: "+modeRef+" or "+modeBytes)
	fs.DurationVar(&o.memcpyDuration, "memcpy-duration", 1500*time.Millisecond, "how long the trainer measures the memcpy gather limit")
	fs.BoolVar(&o.verbose, "v", false, "print every process's logs here, on stderr, instead of to the log file")
	fs.StringVar(&o.logFile, "log-file", "", "append every process's logs to this file (default: a new file in the system temporary "+
		"directory, named at the end; roles: stderr); warnings and errors go to stderr as well")
	fs.StringVar(&o.trainerLang, "trainer", langGo, "the trainer's language: "+langGo+" or "+langPython+
		" (numpy, the Python client in python/); with "+langPython+" each mode also runs with a Go trainer, reported beside it")
	fs.StringVar(&o.writersLang, "writers-lang", langGo, "the writers' language: "+langGo+" or "+langPython+
		"; with "+langPython+" each mode also runs with Go writers, reported beside it")
	fs.StringVar(&o.python, "python", "", "the Python interpreter of Python roles (default: the first of python3 and "+
		"/usr/bin/python3 that imports numpy and msgpack)")
	fs.BoolVar(&o.child, "child", false, "internal: started by the parent, stop when stdin closes")
	return fs
}

// Run runs the benchmark as args say (its flags), with results on
// env.Stdout and progress and logs on env.Stderr; the package documentation
// says what it does. It starts its processes with env.Self. ctx ending
// stops it: the processes it started are stopped and its files removed
// before it returns. Errors that a different command line fixes match
// bench.ErrUsage; "-h" prints the flags to env.Stdout and returns
// flag.ErrHelp.
func Run(ctx context.Context, env bench.Env, args []string) error {
	if wantsSlices(args) { // --sampler slice: slices.go
		return runSlices(ctx, env, args)
	}
	var o options
	var modes string
	fs := newFlagSet(&o, &modes)
	if err := bench.Parse(name, fs, args, env.Stdout, "child"); err != nil {
		return err
	}
	o.modes = strings.Split(modes, ",")
	o.self = env.Self
	stdout, stderr := env.Stdout, env.Stderr
	if err := o.check(); err != nil {
		return err
	}
	stderr = &lockedWriter{w: stderr}
	log, closeLog, err := o.logger(stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	if o.role == "" {
		return runParent(ctx, &o, stdout, stderr, log)
	}
	log = log.With("role", o.role, "pid", os.Getpid())
	if o.child {
		cctx, stop := nodeproc.ChildContext()
		defer stop()
		cctx, cancel := context.WithCancel(cctx)
		defer cancel()
		defer context.AfterFunc(ctx, cancel)()
		ctx = cctx
	}
	switch o.role {
	case roleBuffer:
		err = runBuffer(ctx, &o, stdout, stderr, log)
	case roleWriter:
		err = runWriter(ctx, &o, stdout, log)
	case roleTrainer:
		err = runTrainer(ctx, &o, stdout, log)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", o.role, err)
	}
	return nil
}

// logger returns where this process logs. With -v, and in a role started
// without --log-file, that is stderr. Otherwise it is the log file, with
// warnings and errors on stderr as well: --log-file, opened for appending
// (the parent and its children share it), or for the parent without it a
// new file in the system temporary directory, which sets o.logFile. close
// closes the file.
func (o *options) logger(stderr io.Writer) (log *slog.Logger, close func() error, err error) {
	if o.verbose || (o.role != "" && o.logFile == "") {
		return slog.New(slog.NewTextHandler(stderr, nil)), func() error { return nil }, nil
	}
	if o.logFile == "" {
		f, err := os.CreateTemp("", "tensorwire-bench-replay-*.log")
		if err != nil {
			return nil, nil, fmt.Errorf("the log file: %w", err)
		}
		o.logFile = f.Name()
		f.Close() // reopened for appending, as the children open it
	}
	// O_APPEND: the processes share the file, and each record is one write
	// at its end, never over another's.
	f, err := os.OpenFile(o.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("the log file: %w", err)
	}
	h := slog.NewMultiHandler(slog.NewTextHandler(f, nil), slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return slog.New(h), f.Close, nil
}

// childLogArgs are the flags that make a child process log where this one
// does: to the same file, or to stderr.
func (o *options) childLogArgs() []string {
	if o.verbose || o.logFile == "" {
		return nil
	}
	return []string{"--log-file", o.logFile}
}

// check validates the options.
func (o *options) check() error {
	switch {
	case o.duration <= 0:
		return usagef("--duration must be positive")
	case o.writers < 1:
		return usagef("--writers must be at least 1")
	case o.capacity < 1:
		return usagef("--capacity must be at least 1")
	case o.batch < 1 || o.batch > o.capacity:
		return usagef("--batch must be between 1 and --capacity")
	case o.sampleBatch < 1:
		return usagef("--sample-batch must be at least 1")
	case o.minSize < 1 || o.minSize > o.capacity:
		return usagef("--min-size must be between 1 and --capacity")
	case o.memcpyDuration <= 0:
		return usagef("--memcpy-duration must be positive")
	case o.name == "":
		return usagef("--name must not be empty")
	}
	for _, l := range []struct{ flag, lang string }{{"--trainer", o.trainerLang}, {"--writers-lang", o.writersLang}} {
		if l.lang != langGo && l.lang != langPython {
			return usagef("%s: unknown language %q (want %s or %s)", l.flag, l.lang, langGo, langPython)
		}
	}
	if o.role != "" && o.pythonRun() {
		return usagef("--trainer and --writers-lang choose the parent's children; a --role process is Go (run python3 -m tensorwire._bench_replay for a Python one)")
	}
	for i, m := range o.modes {
		if m != modeRef && m != modeBytes {
			return usagef("--modes: unknown mode %q (want %s or %s)", m, modeRef, modeBytes)
		}
		if slices.Contains(o.modes[:i], m) {
			return usagef("--modes: %s given twice", m)
		}
	}
	switch o.role {
	case "":
	case roleBuffer:
		if o.root == "" {
			return usagef("the buffer role needs --root")
		}
	case roleWriter, roleTrainer:
		if o.addr == "" {
			return usagef("the %s role needs --addr", o.role)
		}
		if o.mode != modeRef && o.mode != modeBytes {
			return usagef("--mode: unknown mode %q (want %s or %s)", o.mode, modeRef, modeBytes)
		}
	default:
		return usagef("--role: unknown role %q (want buffer, writer or trainer)", o.role)
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
