package store

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/report"
)

const (
	publishPeriod = 200 * time.Millisecond // the cadence
	putPeriod     = 20 * time.Millisecond
	readyTimeout  = 30 * time.Second
	stopTimeout   = 60 * time.Second // a drainer may have a backlog to drain
	watchers      = 64
	watchersPer   = 16 // clients per watcher process
	appenders     = 4
)

// proc is a role running in a child process.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   string        // its result file
	ready string        // what followed "ready" on its first line
	held  atomic.Uint64 // the last "held N" line it printed (readers)
	done  chan struct{}
	err   error
}

// start runs a role: the program again with Self, --role and args, and
// waits until it prints "ready".
func start(ctx context.Context, o *options, env bench.Env, dir, name string, args ...string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return startArgv(ctx, env, dir, name, slices.Concat([]string{exe}, o.self, args), nil)
}

// startArgv runs the role argv (with "--out FILE" added) in environ (nil:
// this process's) and waits until it prints "ready".
func startArgv(ctx context.Context, env bench.Env, dir, name string, argv, environ []string) (*proc, error) {
	out := filepath.Join(dir, strings.NewReplacer(" ", "-", "/", "-").Replace(name)+".json")
	argv = append(slices.Clone(argv), "--out", out)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ
	cmd.Stderr = env.Stderr
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	line := make(chan string, 1)
	go func() {
		br := bufio.NewReader(stdout)
		s, _ := br.ReadString('\n')
		line <- s
		for {
			s, err := br.ReadString('\n')
			if v, ok := strings.CutPrefix(strings.TrimSpace(s), "held "); ok {
				n, _ := strconv.ParseUint(v, 10, 64)
				p.held.Store(n)
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case s := <-line:
		rest, ok := strings.CutPrefix(strings.TrimSpace(s), "ready")
		if !ok {
			p.kill()
			return nil, fmt.Errorf("%s did not start: %v", name, p.err)
		}
		p.ready = strings.TrimSpace(rest)
		return p, nil
	case <-time.After(readyTimeout):
		p.kill()
		return nil, fmt.Errorf("%s not ready within %v", name, readyTimeout)
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
}

func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// wait waits for the role to end by itself, up to d.
func (p *proc) wait(ctx context.Context, d time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(d):
		p.kill()
		return fmt.Errorf("%s did not finish within %v", p.name, d)
	case <-ctx.Done():
		p.kill()
		return ctx.Err()
	}
	if p.err != nil {
		return fmt.Errorf("%s: %w", p.name, p.err)
	}
	return nil
}

// stop ends the role (its stdin closes: its context ends) and waits.
func (p *proc) stop(ctx context.Context) error {
	p.stdin.Close()
	return p.wait(ctx, stopTimeout)
}

// result reads the role's result.
func (p *proc) result(v any) error {
	b, err := os.ReadFile(p.out)
	if err != nil {
		return fmt.Errorf("%s's result: %w", p.name, err)
	}
	return json.Unmarshal(b, v)
}

// stopAll stops every proc, returning the first error.
func stopAll(ctx context.Context, ps []*proc) error {
	var first error
	for _, p := range ps {
		p.stdin.Close()
	}
	for _, p := range ps {
		if err := p.wait(ctx, stopTimeout); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func runParent(ctx context.Context, o *options, env bench.Env) error {
	root, err := os.MkdirTemp(o.root, "tensorwire-storebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return err
	}
	outs := filepath.Join(root, "results")
	if err := os.Mkdir(outs, 0o755); err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(env.Stderr, "bench store: "+format+"\n", args...) }
	nodeArgs := []string{"--role", "node", "--root", root}
	if o.noSync {
		nodeArgs = append(nodeArgs, "--sync", "none")
	}
	node, err := start(ctx, o, env, outs, "node", nodeArgs...)
	if err != nil {
		return err
	}
	defer node.stop(context.Background())
	addr := node.ready
	r := &results{started: time.Now(), o: o}
	if o.has("broadcast") {
		for _, mode := range o.modes {
			for _, mb := range o.mbs {
				for _, n := range o.workers {
					logf("broadcast %s, %d MB, %d workers", mode, mb, n)
					b, err := runBroadcast(ctx, o, env, outs, root, addr, mode, mb, n)
					if err != nil {
						return fmt.Errorf("broadcast %s %d MB to %d: %w", mode, mb, n, err)
					}
					r.broadcast = append(r.broadcast, b)
				}
			}
		}
	}
	if o.has("rollouts") {
		logf("rollouts: %d workers appending 28 KB items", appenders)
		if r.rollouts, err = runRollouts(ctx, o, env, outs, root, addr); err != nil {
			return fmt.Errorf("rollouts: %w", err)
		}
	}
	if o.has("watch") {
		logf("watch: %d watchers", watchers)
		if r.watch, err = runWatch(ctx, o, env, outs, root, addr); err != nil {
			return fmt.Errorf("watch: %w", err)
		}
	}
	if err := node.stop(ctx); err != nil {
		return err
	}
	if err := r.print(env.Stdout); err != nil {
		return err
	}
	if o.json != "" {
		return report.WriteJSON(o.json, r.json())
	}
	return nil
}

// broadcastResult is one configuration of the broadcast.
type broadcastResult struct {
	mode          string
	mb, workers   int
	latency       []time.Duration // per version every worker held
	skipped       int             // versions some worker never held (it was busy with an older one)
	publishP50    time.Duration
	badCRC        int
	versionsTotal int
}

func runBroadcast(ctx context.Context, o *options, env bench.Env, outs, root, addr, mode string, mb, n int) (broadcastResult, error) {
	res := broadcastResult{mode: mode, mb: mb, workers: n}
	param := fmt.Sprintf("params-%s-%d-%d", mode, mb, n)
	common := []string{"--root", root, "--mode", mode, "--param", param}
	var relay *proc
	readerRole, pubRole := "reader", "publisher"
	if mode == modeTCP {
		var err error
		if relay, err = start(ctx, o, env, outs, "relay", "--role", "tcp-relay", "--n", strconv.Itoa(n)); err != nil {
			return res, err
		}
		defer relay.kill()
		addr = relay.ready
		common = nil
		readerRole, pubRole = "tcp-reader", "tcp-publisher"
	}
	var readers []*proc
	defer func() {
		for _, p := range readers {
			select {
			case <-p.done:
			default:
				p.kill()
			}
		}
	}()
	for i := range n {
		p, err := start(ctx, o, env, outs, fmt.Sprintf("%s %d", readerRole, i),
			append([]string{"--role", readerRole, "--addr", addr}, common...)...)
		if err != nil {
			return res, err
		}
		readers = append(readers, p)
	}
	pub, err := start(ctx, o, env, outs, pubRole, append([]string{"--role", pubRole, "--addr", addr,
		"--size", strconv.Itoa(mb), "--period", publishPeriod.String(), "--duration", o.duration.String()}, common...)...)
	if err != nil {
		return res, err
	}
	if err := pub.wait(ctx, o.duration+5*time.Minute); err != nil {
		return res, err
	}
	// Give the readers the time the slowest version may still need, then
	// stop them: a version they hold after that is not counted.
	var pr publishResult
	if err := pub.result(&pr); err != nil {
		return res, err
	}
	var last uint64
	for v := range pr.Start {
		last = max(last, v)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if allHeld(readers, last) {
			break
		}
	}
	if err := stopAll(ctx, readers); err != nil {
		return res, err
	}
	if relay != nil {
		relay.stdin.Close()
		relay.wait(ctx, stopTimeout)
	}
	held := make([]readResult, n)
	for i, p := range readers {
		if err := p.result(&held[i]); err != nil {
			return res, err
		}
		res.badCRC += held[i].BadCRC
	}
	res.publishP50 = pr.Publish.Quantile(50)
	res.versionsTotal = len(pr.Start)
	for _, v := range slices.Sorted(mapKeys(pr.Start)) {
		latest := int64(0)
		all := true
		for _, h := range held {
			t, ok := h.Held[v]
			if !ok {
				all = false
				break
			}
			latest = max(latest, t)
		}
		if !all {
			res.skipped++
			continue
		}
		res.latency = append(res.latency, time.Duration(latest-pr.Start[v]))
	}
	return res, nil
}

// allHeld reports whether every reader has said it held version v.
func allHeld(readers []*proc, v uint64) bool {
	for _, p := range readers {
		if p.held.Load() < v {
			return false
		}
	}
	return true
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// rolloutsResult is the rollouts part's.
type rolloutsResult struct {
	acked      int
	seconds    float64
	latency    report.Latency
	lost, dups int
	badCRC     int
	drained    int
	gets       int
	getP50     time.Duration
}

func runRollouts(ctx context.Context, o *options, env bench.Env, outs, root, addr string) (rolloutsResult, error) {
	var res rolloutsResult
	drainer, err := start(ctx, o, env, outs, "drainer", "--role", "drainer", "--addr", addr, "--root", root)
	if err != nil {
		return res, err
	}
	defer drainer.stdin.Close()
	var py *pythonRoles
	if o.writersLang == langPython {
		if py, err = newPythonRoles(o.python, outs); err != nil {
			drainer.stop(ctx)
			return res, err
		}
	}
	var apps []*proc
	for i := range appenders {
		var p *proc
		var err error
		if py != nil {
			p, err = py.appender(ctx, o, env, outs, root, addr, i)
		} else {
			p, err = start(ctx, o, env, outs, fmt.Sprintf("appender %d", i), "--role", "appender", "--addr", addr,
				"--root", root, "--n", strconv.Itoa(i), "--inflight", strconv.Itoa(o.inflight), "--extend", strconv.Itoa(o.extend))
		}
		if err != nil {
			stopAll(ctx, apps)
			return res, err
		}
		apps = append(apps, p)
	}
	select {
	case <-time.After(o.duration):
	case <-ctx.Done():
		stopAll(context.Background(), apps)
		return res, ctx.Err()
	}
	if err := stopAll(ctx, apps); err != nil {
		return res, err
	}
	if err := drainer.stop(ctx); err != nil {
		return res, err
	}
	var dr drainResult
	if err := drainer.result(&dr); err != nil {
		return res, err
	}
	var first, last int64
	for i, p := range apps {
		var ar appendResult
		if err := p.result(&ar); err != nil {
			return res, err
		}
		if first == 0 || ar.FirstNS < first {
			first = ar.FirstNS
		}
		last = max(last, ar.LastNS)
		res.latency.Merge(&ar.Latency)
		for g, n := range ar.Acked {
			res.acked += n
			s := dr.Seen[fmt.Sprintf("%d:%d", i, g)]
			if s == nil {
				res.lost += n
				continue
			}
			for _, m := range s.Missing {
				if m < n {
					res.lost++
				}
			}
			res.lost += max(0, n-(s.Max+1))
		}
	}
	res.seconds = time.Duration(last - first).Seconds()
	res.dups, res.badCRC, res.drained, res.gets = dr.Dups, dr.BadCRC, dr.Items, dr.Gets
	res.getP50 = dr.GetLat.Quantile(50)
	return res, nil
}

// watchResultAll is the watch part's.
type watchResultAll struct {
	latency []time.Duration
	missed  int // events a watcher did not get after its first
	puts    int
}

func runWatch(ctx context.Context, o *options, env bench.Env, outs, root, addr string) (watchResultAll, error) {
	var res watchResultAll
	var ws []*proc
	defer func() {
		for _, p := range ws {
			select {
			case <-p.done:
			default:
				p.kill()
			}
		}
	}()
	for i := range watchers / watchersPer {
		p, err := start(ctx, o, env, outs, fmt.Sprintf("watchers %d", i), "--role", "watcher", "--addr", addr,
			"--root", root, "--mode", modeBytes, "--n", strconv.Itoa(watchersPer))
		if err != nil {
			return res, err
		}
		ws = append(ws, p)
	}
	time.Sleep(500 * time.Millisecond) // the watches' first calls reach the node
	putter, err := start(ctx, o, env, outs, "putter", "--role", "putter", "--addr", addr, "--root", root,
		"--period", putPeriod.String(), "--duration", o.duration.String())
	if err != nil {
		return res, err
	}
	if err := putter.wait(ctx, o.duration+5*time.Minute); err != nil {
		return res, err
	}
	time.Sleep(200 * time.Millisecond) // the last event reaches every watcher
	if err := stopAll(ctx, ws); err != nil {
		return res, err
	}
	var pr putResult
	if err := putter.result(&pr); err != nil {
		return res, err
	}
	res.puts = len(pr.Start)
	revs := slices.Sorted(mapKeys(pr.Start))
	for _, p := range ws {
		var wr watchResult
		if err := p.result(&wr); err != nil {
			return res, err
		}
		for _, held := range wr.Held {
			seen := false
			for _, rev := range revs {
				t, ok := held[rev]
				if !ok {
					if seen {
						res.missed++
					}
					continue
				}
				seen = true
				res.latency = append(res.latency, time.Duration(t-pr.Start[rev]))
			}
		}
	}
	return res, nil
}
