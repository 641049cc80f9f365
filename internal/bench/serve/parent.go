package serve

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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/serve"
)

const (
	// readyTimeout bounds how long the clients of a run may take to dial
	// and warm up.
	readyTimeout = 2 * time.Minute
	// resultTimeout bounds how long a client may take to report after its
	// timed phase.
	resultTimeout = time.Minute
)

// runResult is what one run measured.
type runResult struct {
	model    string
	clients  int
	maxBatch int
	update   bool

	requests  int64
	errors    int64
	latency   report.Latency
	window    time.Duration
	sizes     []uint64 // batches by rows, in the window
	batches   uint64
	rows      uint64
	nodeCPU   time.Duration // -1: unknown
	replCPU   time.Duration // Python replicas' (python.go); -1: unknown
	bitEqual  string        // py-mlp: "ok/n" batches bit-equal to the module called directly
	clientCPU time.Duration // -1: unknown
	versions  uint64        // parameter versions loaded in the window
	forward   time.Duration
}

// runParent runs every run in turn, as processes of their own over a new
// shared root, and reports.
func runParent(ctx context.Context, o *options, stdout, stderr io.Writer, log *slog.Logger) error {
	root, err := os.MkdirTemp(o.root, "tensorwire-servebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return err
	}
	if slices.ContainsFunc(o.models, isPython) || o.clientLang == "python" {
		if err := o.findPython(); err != nil {
			return err
		}
		if err := o.extractPython(root); err != nil {
			return err
		}
	}
	rep := &Result{LimitRowsPerS: map[string]float64{}}
	rep.Wake, rep.wakeLine = benchkit.WakeReference()
	fmt.Fprintf(stderr, "serve: %s\n", rep.wakeLine)
	var runs []*runResult
	for _, model := range o.models {
		var lim float64
		var per time.Duration
		if isPython(model) {
			lim, per, err = o.pyLimit(ctx, model)
		} else {
			lim, per, err = limit(model, o.maxBatch, o.replicas, o.limitDur)
		}
		if err != nil {
			return fmt.Errorf("%s limit: %w", model, err)
		}
		rep.LimitRowsPerS[model] = lim
		rep.limitForward = append(rep.limitForward, per)
		fmt.Fprintf(stderr, "serve: %s: in-process limit %.0f rows/s (a forward of %d rows: %.3f ms)\n",
			model, lim, o.maxBatch, report.Ms(per))
		for _, n := range o.clients {
			for _, mb := range []int{o.maxBatch, 1} {
				r, err := runOne(ctx, o, root, model, n, mb, false, stderr, log)
				if err != nil {
					return fmt.Errorf("%s, %d clients, max batch %d: %w", model, n, mb, err)
				}
				runs = append(runs, r)
				fmt.Fprintf(stderr, "serve: %s, %d clients, max batch %d: %.0f requests/s, p99 %.2f ms, mean batch %.2f\n",
					model, n, mb, float64(r.requests)/r.window.Seconds(), report.Ms(r.latency.Quantile(99)), r.meanBatch())
			}
		}
	}
	var upd, base *runResult
	if o.updateMB > 0 && slices.Contains(o.models, modelFake) {
		n := 32
		if !slices.Contains(o.clients, n) {
			n = slices.Max(o.clients)
		}
		for _, r := range runs {
			if r.model == modelFake && r.clients == n && r.maxBatch == o.maxBatch {
				base = r
			}
		}
		if upd, err = runOne(ctx, o, root, modelFake, n, o.maxBatch, true, stderr, log); err != nil {
			return fmt.Errorf("weight update run: %w", err)
		}
		fmt.Fprintf(stderr, "serve: fake, %d clients, loading %d MiB every %v: p99 %.2f ms\n",
			n, o.updateMB, o.updateEvery, report.Ms(upd.latency.Quantile(99)))
	}
	rep.build(o, runs, base, upd)
	if err := rep.print(stdout, o); err != nil {
		return err
	}
	if o.json != "" {
		return report.WriteJSON(o.json, rep)
	}
	return nil
}

// runOne runs one node and its clients, each a process of its own, and
// returns what they measured in the timed phase.
func runOne(ctx context.Context, o *options, root, model string, clients, maxBatch int, update bool, stderr io.Writer, log *slog.Logger) (_ *runResult, err error) {
	limit := o.duration + readyTimeout + resultTimeout + time.Minute
	ctx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("the run did not end within %v", limit))
	defer cancel()
	verbose := []string{}
	if o.verbose {
		verbose = []string{"-v"}
	}
	itoa := strconv.Itoa
	args := slices.Concat(o.self, []string{"--role", roleNode, "--child", "--root", root, "--run-model", model,
		"--max-batch", itoa(maxBatch), "--replicas", itoa(o.replicas), "--max-delay", o.maxDelay.String()}, verbose)
	if update {
		args = append(args, "--update", "--update-mb", itoa(o.updateMB), "--update-every", o.updateEvery.String())
	}
	profile := func(role string) []string {
		if o.nodeProfile == "" || update {
			return nil
		}
		return []string{"--profile-to", fmt.Sprintf("%s-%s-%d-%d-%s.pprof", o.nodeProfile, model, clients, maxBatch, role)}
	}
	args = append(args, profile(roleNode)...)
	node, err := nodeproc.Spawn(ctx, nodeproc.Child{Name: "the node", Args: args, Stderr: stderr})
	if err != nil {
		return nil, err
	}
	defer node.Stop()
	log.Info("node listening", "model", model, "pid", node.Pid(), "addr", node.Addr)
	sc, err := serve.Dial(ctx, node.Addr, modelName, serve.WithBytes())
	if err != nil {
		return nil, err
	}
	defer sc.Close()

	var repl pyReplicas
	if isPython(model) {
		replProfile := ""
		if o.nodeProfile != "" && !update {
			replProfile = fmt.Sprintf("%s-%s-%d-%d-%s.txt", o.nodeProfile, model, clients, maxBatch, "replica")
		}
		if repl, err = o.startReplicas(ctx, sc, node.Addr, root, model, replProfile, stderr); err != nil {
			return nil, err
		}
		defer repl.stop()
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	procs := make([]*clientProc, 0, clients)
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for i := range clients {
		var p *clientProc
		if o.clientLang == "python" {
			p, err = startClient(ctx, o.pythonExe, []string{"-c", pyScript, "client", node.Addr, root, o.mode, itoa(i + 1), modelName, itoa(o.inFlight)}, o.pyEnv(), stderr)
		} else {
			p, err = startClient(ctx, exe, slices.Concat(o.self, []string{"--role", roleClient, "--child", "--addr", node.Addr,
				"--root", root, "--mode", o.mode, "--seed", itoa(i + 1), "--client-procs", itoa(o.clientProcs), "--in-flight", itoa(o.inFlight)},
				verbose, firstOnly(i, profile(roleClient))), nil, stderr)
		}
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	deadline := time.After(readyTimeout)
	for i, p := range procs {
		select {
		case <-p.tap.ready:
		case <-p.exited:
			return nil, fmt.Errorf("client %d exited before it was ready: %v", i, p.err)
		case <-node.Done():
			return nil, fmt.Errorf("the node exited: %v", node.Stop())
		case <-deadline:
			return nil, fmt.Errorf("client %d was not ready within %v", i, readyTimeout)
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	start := time.Now().Add(50*time.Millisecond + time.Duration(clients)*time.Millisecond)
	end := start.Add(o.duration)
	for _, p := range procs {
		fmt.Fprintf(p.stdin, "START %d %d\n", start.UnixNano(), end.UnixNano())
	}
	r := &runResult{model: model, clients: clients, maxBatch: maxBatch, update: update, window: o.duration}
	st0, cpu0, err := snapshot(ctx, sc, node.Pid(), start)
	if err != nil {
		return nil, err
	}
	rcpu0 := repl.cpu()
	st1, cpu1, err := snapshot(ctx, sc, node.Pid(), end)
	if err != nil {
		return nil, err
	}
	r.replCPU = -1
	if rcpu1 := repl.cpu(); rcpu0 >= 0 && rcpu1 >= 0 {
		r.replCPU = rcpu1 - rcpu0
	}
	r.batches, r.rows = st1.Batches-st0.Batches, st1.Rows-st0.Rows
	r.versions, r.forward = st1.Version-st0.Version, st1.Forward-st0.Forward
	r.sizes = make([]uint64, len(st1.Sizes))
	for i := range st1.Sizes {
		r.sizes[i] = st1.Sizes[i] - st0.Sizes[i]
	}
	r.nodeCPU = -1
	if cpu0 >= 0 && cpu1 >= 0 {
		r.nodeCPU = cpu1 - cpu0
	}
	for i, p := range procs {
		var cr clientResult
		if err := p.result(ctx, &cr); err != nil {
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
		for _, ns := range cr.LatenciesNS { // a Python client's
			cr.Latency.Record(time.Duration(ns))
		}
		r.requests += cr.Requests
		r.errors += cr.Errors
		if cr.CPUNS < 0 || r.clientCPU < 0 {
			r.clientCPU = -1
		} else {
			r.clientCPU += time.Duration(cr.CPUNS)
		}
		r.latency.Merge(&cr.Latency)
	}
	if model == modelPyMLP {
		const n = 64
		ok, err := o.pyCheck(ctx, node.Addr, root, n)
		if err != nil {
			return nil, fmt.Errorf("checking the outputs: %w", err)
		}
		r.bitEqual = fmt.Sprintf("%d/%d", ok, n)
	}
	// The replicas go first, and the node is stopped once it has seen them
	// leave: a replica whose node stops under it warns that it was
	// detached and tries to attach again, and a node stopped while it
	// still counts a replica warns that one was detached; neither is
	// anything a run's reader should see.
	if repl != nil {
		repl.stop()
		waitDetached(ctx, sc)
	}
	if err := node.Stop(); err != nil {
		return nil, fmt.Errorf("the node: %w", err)
	}
	return r, nil
}

// snapshot waits until at, then returns the model's stats and the node's
// CPU time (-1 if unknown).
func snapshot(ctx context.Context, sc *serve.Client, pid int, at time.Time) (serve.Stats, time.Duration, error) {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return serve.Stats{}, 0, context.Cause(ctx)
	}
	cpu := procCPU(pid)
	st, err := sc.Stats(ctx)
	return st, cpu, err
}

// procCPU returns the CPU time, user and system, of process pid, from
// /proc (Linux); -1 where it cannot be read.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces: state is field 3, utime 14 and stime 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	const clkTck = 100 // USER_HZ, 100 on every Linux architecture Go supports
	return time.Duration(ut+st) * time.Second / clkTck
}

// clientProc is a client process: this program re-executed with
// bench.Env.Self and the client role's flags.
type clientProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	tap    *tap
	exited chan struct{}
	err    error
}

// startClient starts a client process: exe with args, in env (nil: this
// process's).
func startClient(ctx context.Context, exe string, args, env []string, stderr io.Writer) (*clientProc, error) {
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	p := &clientProc{cmd: cmd, stdin: stdin, tap: newTap(stderr), exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.tap, stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a client: %w", err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// result waits for the client's result and exit, and decodes the result
// into v.
func (p *clientProc) result(ctx context.Context, v any) error {
	t := time.NewTimer(resultTimeout)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		return fmt.Errorf("no result within %v of its timed phase", resultTimeout)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if p.err != nil {
		return fmt.Errorf("pid %d: %w", p.cmd.Process.Pid, p.err)
	}
	return p.tap.decode(v)
}

// stop closes the client's stdin, which ends it, and waits for it.
func (p *clientProc) stop() {
	p.stdin.Close()
	<-p.exited
}

// tap passes a client's output through to w, line by line, except its
// ready line, which it signals, and its result, which it keeps. It is
// safe for concurrent use.
type tap struct {
	w       io.Writer
	mu      sync.Mutex
	partial []byte
	result  []byte
	ready   chan struct{}
	isReady bool
}

func newTap(w io.Writer) *tap { return &tap{w: w, ready: make(chan struct{})} }

func (t *tap) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		line := t.partial[:i+1]
		switch {
		case !t.isReady && string(bytes.TrimSpace(line)) == readyLine:
			t.isReady = true
			close(t.ready)
		case t.result == nil && bytes.HasPrefix(line, resultPrefix):
			t.result = bytes.Clone(line)
		default:
			if _, err := t.w.Write(line); err != nil {
				return 0, err
			}
		}
		t.partial = t.partial[i+1:]
	}
	return len(p), nil
}

func (t *tap) decode(v any) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.result == nil {
		return fmt.Errorf("it printed no result")
	}
	return json.Unmarshal(t.result, v)
}

func (r *runResult) meanBatch() float64 {
	if r.batches == 0 {
		return 0
	}
	return float64(r.rows) / float64(r.batches)
}

// firstOnly returns args for client 0 and nothing for the others.
func firstOnly(i int, args []string) []string {
	if i == 0 {
		return args
	}
	return nil
}
