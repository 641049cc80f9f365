package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/python"
)

const (
	// modeTimeout is how long a mode may take beyond its timed phase
	// (start-up, warm-up, memcpy limit, checkpoint) before it is stopped
	// as hung.
	modeTimeout = 10 * time.Minute

	// stopTimeout is how long a stopped writer or trainer may take to exit
	// after SIGTERM before it is killed.
	stopTimeout = 10 * time.Second

	// resultTimeout is how long the buffer node's result may take to come
	// through after it exited.
	resultTimeout = 5 * time.Second
)

// runParent runs every mode in turn, as processes of their own over a new
// shared root, and reports.
func runParent(ctx context.Context, o *options, stdout, stderr io.Writer, log *slog.Logger) (err error) {
	defer context.AfterFunc(ctx, func() {
		log.Warn("interrupted: stopping the processes and removing the shared root (interrupt again to quit at once)",
			"cause", context.Cause(ctx))
	})()
	if logs := o.childLogArgs(); logs != nil {
		fmt.Fprintf(stderr, "replay: logs go to %s (-v prints them here)\n", o.logFile)
		defer fmt.Fprintf(stderr, "replay: the processes' logs are in %s\n", o.logFile)
	}

	root, err := newRoot(o.root)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := os.RemoveAll(root); rerr != nil {
			log.Error("removing the shared root", "dir", root, "err", rerr)
		}
	}()
	tokenFile := o.tokenFile
	if tokenFile == "" {
		var remove func()
		if tokenFile, remove, err = nodeproc.TempToken(); err != nil {
			return err
		}
		defer remove()
	}
	var py *pythonEnv
	if o.pythonRun() {
		if py, err = newPythonEnv(o.python, root); err != nil {
			return err
		}
		defer py.remove()
		o.python = py.interp
	}
	log.Info("replay benchmark", "root", root, "modes", o.modes, "writers", o.writers, "capacity", o.capacity,
		"batch", o.batch, "sample_batch", o.sampleBatch, "min_size", o.minSize, "duration", o.duration,
		"trainer", o.trainerLang, "writers_lang", o.writersLang)

	results, goResults := map[string]*modeResult{}, map[string]*modeResult{}
	for _, mode := range o.modes {
		runs := []roleLangs{{o.trainerLang, o.writersLang}}
		if o.pythonRun() {
			runs = []roleLangs{{langGo, langGo}, runs[0]} // the all-Go run first, for comparison
		}
		for _, langs := range runs {
			r, err := runMode(ctx, o, mode, langs, py, root, tokenFile, stderr, log)
			if ctx.Err() != nil {
				return fmt.Errorf("%s mode: stopped: %w", mode, ctx.Err()) // err is a consequence
			}
			if err != nil {
				return fmt.Errorf("%s mode (trainer %s, writers %s): %w", mode, langs.trainer, langs.writers, err)
			}
			if langs == runs[len(runs)-1] {
				results[mode] = r
			} else {
				goResults[mode] = r
			}
		}
	}
	rep := newReport(o, results, goResults)
	if err := rep.print(stdout); err != nil {
		return err
	}
	if o.json != "" {
		return report.WriteJSON(o.json, rep.result())
	}
	return nil
}

// newRoot makes the run's shared root: a new folder under dir (the system
// temporary directory if ""), as an absolute path without symlinks.
func newRoot(dir string) (string, error) {
	root, err := os.MkdirTemp(dir, "tensorwire-replaybench-")
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(root)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		os.RemoveAll(root)
		return "", err
	}
	return abs, nil
}

// modeResult is what one mode's processes reported.
type modeResult struct {
	mode    string
	writers []writerResult
	trainer trainerResult
	buffer  bufferResult
}

// roleLangs are the languages of a run's trainer and writers.
type roleLangs struct{ trainer, writers string }

// pythonEnv is how Python roles run: an interpreter that imports numpy and
// msgpack, and a folder holding this build's Python client (python.Extract)
// for its PYTHONPATH.
type pythonEnv struct {
	interp string
	path   string
}

// newPythonEnv finds the interpreter (findPython) and extracts the client
// into root/python, a folder of the run's shared root, removed with it.
func newPythonEnv(interp, root string) (*pythonEnv, error) {
	c, err := findPython(interp)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, "python")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	if err := python.Extract(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &pythonEnv{interp: c, path: dir}, nil
}

// findPython returns interp, or the first of python3 and /usr/bin/python3,
// if it imports numpy and msgpack; a usage error saying what was tried
// otherwise.
func findPython(interp string) (string, error) {
	c, err := benchkit.FindPython(interp, "numpy, msgpack")
	if err != nil {
		return "", usagef("Python roles need a python3 with numpy and msgpack (apt-get install python3-numpy python3-msgpack; "+
			"--python chooses it): %v", err)
	}
	return c, nil
}

func (p *pythonEnv) remove() { os.RemoveAll(p.path) }

// command returns the argv and environment of a role process in lang: this
// program re-executed (o.self), or the Python roles' module.
func (p *pythonEnv) command(o *options, lang string, args []string) (argv, env []string, err error) {
	if lang != langPython {
		exe, err := os.Executable()
		if err != nil {
			return nil, nil, err
		}
		return slices.Concat([]string{exe}, o.self, args), nil, nil
	}
	return slices.Concat([]string{p.interp, "-m", "tensorwire._bench_replay"}, args), p.env(), nil
}

// env is a Python process's environment: PYTHONPATH starts with the
// extracted client.
func (p *pythonEnv) env() []string { return benchkit.PythonEnv(p.path) }

// runMode runs one mode with the trainer and writers in langs (py runs the
// Python ones): a new buffer node serving a new buffer at ROOT/bench-MODE,
// the writers and the trainer, each a process; it waits for the writers
// and the trainer to finish, stops the node, and removes the buffer's
// folder. If any process fails, it stops the others.
func runMode(ctx context.Context, o *options, mode string, langs roleLangs, py *pythonEnv, root, tokenFile string,
	stderr io.Writer, log *slog.Logger) (_ *modeResult, err error) {
	limit := o.duration + modeTimeout
	ctx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("the mode did not end within %v", limit))
	defer cancel()
	name := "bench-" + mode
	defer func() {
		if rerr := os.RemoveAll(filepath.Join(root, name)); rerr != nil && err == nil {
			err = rerr
		}
	}()
	itoa := strconv.Itoa
	bufTap := newResultTap(stderr)
	buf, err := nodeproc.Spawn(ctx, nodeproc.Child{
		Name: "the buffer node",
		Args: slices.Concat(o.self, []string{"--role", roleBuffer, "--child", "--listen", "127.0.0.1:0",
			"--root", root, "--name", name, "--token-file", tokenFile, "--capacity", itoa(o.capacity),
			"--min-size", itoa(o.minSize), "--writers", itoa(o.writers), "--duration", o.duration.String()},
			o.childLogArgs()),
		Stderr: bufTap,
	})
	if err != nil {
		return nil, err
	}
	defer buf.Stop() // on errors; a second Stop returns the first's result
	log.Info("buffer node listening", "mode", mode, "pid", buf.Pid(), "addr", buf.Addr, "trainer", langs.trainer, "writers", langs.writers)
	fmt.Fprintf(stderr, "replay %s: the buffer node (pid %d) listens on %s; starting %d writer(s) in %s and the trainer in %s\n",
		mode, buf.Pid(), buf.Addr, o.writers, langs.writers, langs.trainer)

	pctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	common := slices.Concat([]string{"--child", "--addr", buf.Addr, "--root", root, "--name", name, "--mode", mode,
		"--token-file", tokenFile}, o.childLogArgs())
	var procs []*roleProc
	start := func(name, lang string, args ...string) error {
		argv, env, err := py.command(o, lang, slices.Concat(args, common))
		var p *roleProc
		if err == nil {
			p, err = startRole(pctx, name, stderr, argv, env)
		}
		if err != nil {
			stopAll()
			for _, p := range procs {
				p.wait()
			}
			return err
		}
		procs = append(procs, p)
		return nil
	}
	for i := range o.writers {
		if err := start(fmt.Sprintf("writer %d", i), langs.writers, "--role", roleWriter, "--batch", itoa(o.batch),
			"--insert-rate", strconv.FormatFloat(o.insertRate, 'g', -1, 64)); err != nil {
			return nil, err
		}
	}
	if err := start("the trainer", langs.trainer, "--role", roleTrainer, "--sample-batch", itoa(o.sampleBatch),
		"--memcpy-duration", o.memcpyDuration.String(), "--prefetch="+strconv.FormatBool(o.prefetch)); err != nil {
		return nil, err
	}

	if err := waitAll(ctx, procs, buf, stopAll); err != nil {
		return nil, err
	}
	if err := buf.Stop(); err != nil {
		return nil, err
	}
	res := &modeResult{mode: mode}
	if err := bufTap.decode(resultTimeout, "the buffer node", &res.buffer); err != nil {
		return nil, err
	}
	for _, p := range procs[:o.writers] {
		var w writerResult
		if err := p.tap.decode(0, p.name, &w); err != nil {
			return nil, err
		}
		res.writers = append(res.writers, w)
	}
	if err := procs[o.writers].tap.decode(0, "the trainer", &res.trainer); err != nil {
		return nil, err
	}
	return res, nil
}

// waitAll waits for every process to exit. On the first failure, or if
// the buffer node exits first, or ctx ends, it stops the others (stopAll)
// and returns the first error once they have exited.
func waitAll(ctx context.Context, procs []*roleProc, buf *nodeproc.Proc, stopAll func()) error {
	errs := make(chan error, len(procs))
	for _, p := range procs {
		go func() { errs <- p.wait() }()
	}
	var first error
	fail := func(err error) {
		if first == nil {
			first = err
			stopAll()
		}
	}
	bufDone, ctxDone := buf.Done(), ctx.Done()
	for left := len(procs); left > 0; {
		select {
		case err := <-errs:
			left--
			if err != nil {
				fail(err)
			}
		case <-bufDone:
			bufDone = nil
			fail(fmt.Errorf("the buffer node exited before the run ended: %v", buf.Stop()))
		case <-ctxDone:
			ctxDone = nil
			fail(context.Cause(ctx))
		}
	}
	return first
}

// roleProc is a writer or the trainer, running as a child process: this
// program re-executed with bench.Env.Self and the role's flags. Its stdin is a
// pipe left open, so it stops (ChildContext) if this process dies; its
// result line is kept, and the rest of its output goes to stderr.
type roleProc struct {
	name string
	cmd  *exec.Cmd
	tap  *resultTap
}

// startRole starts a role process, argv (with env, or this process's
// environment when nil); ctx ending stops it (SIGTERM, then SIGKILL after
// stopTimeout).
func startRole(ctx context.Context, name string, stderr io.Writer, argv, env []string) (*roleProc, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopTimeout
	if _, err := cmd.StdinPipe(); err != nil { // held open until the child exits
		return nil, err
	}
	p := &roleProc{name: name, cmd: cmd, tap: newResultTap(stderr)}
	cmd.Stdout, cmd.Stderr = p.tap, stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return p, nil
}

// wait waits for the process to exit and returns an error unless it
// exited with status 0.
func (p *roleProc) wait() error {
	if err := p.cmd.Wait(); err != nil {
		return fmt.Errorf("%s (pid %d): %w", p.name, p.cmd.Process.Pid, err)
	}
	return nil
}

// resultTap passes a child's output through to w, line by line, except
// its result: the first line starting with resultPrefix, which it keeps.
// It is safe for concurrent use (a child's stdout and stderr may share
// it).
type resultTap struct {
	w       io.Writer
	mu      sync.Mutex
	partial []byte
	result  []byte
	got     chan struct{} // closed once result is set
}

func newResultTap(w io.Writer) *resultTap {
	return &resultTap{w: w, got: make(chan struct{})}
}

func (t *resultTap) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		line := t.partial[:i+1]
		if t.result == nil && bytes.HasPrefix(line, resultPrefix) {
			t.result = bytes.Clone(line)
			close(t.got)
		} else if _, err := t.w.Write(line); err != nil {
			return 0, err
		}
		t.partial = t.partial[i+1:]
	}
	if len(t.partial) == 0 {
		t.partial = nil // do not pin what was written
	}
	return len(p), nil
}

// decode decodes the result into v, waiting up to timeout for it to
// arrive.
func (t *resultTap) decode(timeout time.Duration, who string, v any) error {
	select {
	case <-t.got:
	default:
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case <-t.got:
		case <-timer.C:
			return fmt.Errorf("%s printed no result", who)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := json.Unmarshal(t.result, v); err != nil {
		return fmt.Errorf("%s's result: %w", who, err)
	}
	return nil
}
