package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/python"
	"github.com/tensorwire/tensorwire/serve"
)

// Models in Python replicas (--replica python, or --model
// py-mlp,py-null,py-big): the node runs no model (serve.Config.AttachedOnly)
// and --replicas Python processes attach to it (tensorwire.serve.Replica),
// each holding a torch module on --device: py-mlp the MLP 64 -> 256 -> 16
// as torch.nn.Sequential, py-null a module that returns zeros without
// computing (what the hand-off between the node and a Python replica costs
// per batch), py-big the MLP 64 -> 1024 -> 1024 -> 1024 -> 16 (a model
// worth a GPU: issue 26's figures are for 1024-wide layers). They need a
// Python with torch, numpy and msgpack (--python); the run extracts this
// build's Python client into its root for their PYTHONPATH
// (python.Extract).
const (
	modelPyMLP  = "py-mlp"
	modelPyNull = "py-null"
	modelPyBig  = "py-big"
)

// isPython reports whether model runs in Python replicas.
func isPython(model string) bool {
	return model == modelPyMLP || model == modelPyNull || model == modelPyBig
}

// pyScript is the Python side, its module on DEVICE (cpu, cuda:N):
// "replica ADDR ROOT MODEL NAME DEVICE WINDOW [PROFILE]" attaches and
// serves until killed; with PROFILE, under cProfile until SIGTERM, which
// writes the profile's report there (the functions by cumulative and by
// own time, wall clock: waits on the socket and the device count) and
// exits;
// "client ADDR ROOT MODE SEED NAME IN_FLIGHT" is a client process of
// --client-lang python, as the Go client role: a warm-up, READY,
// predictions of one row in a loop (IN_FLIGHT above 1: that many asyncio
// tasks awaiting apredict) timed between the parent's START times, its
// result as JSON (latencies each in ns) once the phase ends;
// "limit MODEL MAX_BATCH SECONDS DEVICE" prints the module's rows/s and ms
// per forward called in-process on batches of MAX_BATCH rows (on CUDA, the
// input on the device and the output brought back to the host, as a
// replica's are); "check ADDR ROOT N NAME DEVICE" predicts N batches of
// 1..16 rows through the node and prints how many came back bit-equal to
// the module called directly on the same device.
const pyScript = `
import sys, time, numpy as np
if sys.argv[1] != "client":  # a client needs numpy alone: no torch in each of 128 processes
    import torch
    torch.set_num_threads(1)
def module(kind, dev):
    torch.manual_seed(1)
    if kind == "py-mlp":
        m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    elif kind == "py-big":
        m = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16))
    else:
        class Null(torch.nn.Module):
            def forward(self, x):
                return torch.zeros(x.shape[0], 16, device=x.device)
        m = Null()
    return m.to(dev).eval()
cmd = sys.argv[1]
if cmd == "replica":
    import tensorwire
    dev = sys.argv[6]
    r = tensorwire.serve.Replica(sys.argv[2], sys.argv[5], module(sys.argv[4], dev), root=sys.argv[3], device=dev,
                                 window=int(sys.argv[7]))
    if len(sys.argv) > 8:
        import cProfile, io, os, pstats, signal
        pr = cProfile.Profile()
        def report(*_):
            pr.disable()
            buf = io.StringIO()
            buf.write(f"cProfile of a {sys.argv[4]} replica on {dev} (window {sys.argv[7]}): {r.batches} batches\n")
            for key in ("cumulative", "tottime"):
                pstats.Stats(pr, stream=buf).sort_stats(key).print_stats(25)
            with open(sys.argv[8], "w") as f:
                f.write(buf.getvalue())
            os._exit(0)
        signal.signal(signal.SIGTERM, report)
        pr.enable()
    r.run()
elif cmd == "limit":
    dev = sys.argv[5]
    m, n, secs = module(sys.argv[2], dev), int(sys.argv[3]), float(sys.argv[4])
    pin = dev.startswith("cuda")
    x = torch.randn(n, 64)
    if pin:
        x = x.pin_memory()
    k, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - t0 < secs:
            m(x.to(dev, non_blocking=True)).cpu(); k += 1
    took = time.perf_counter() - t0
    print(f"{k * n / took} {took / k * 1e3}")
elif cmd == "client":
    import json, os, threading
    import tensorwire
    addr, root, mode, seed, name = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
    inflight = int(sys.argv[7])
    c = tensorwire.serve.Client(addr, name, root=root, bytes_mode=mode == "bytes", max_in_flight=max(128, inflight))
    if c.mode != mode:
        sys.exit(f"the client works in mode {c.mode}, not {mode}: does it share the node's root?")
    x = np.random.default_rng(seed).normal(size=(1, 64)).astype(np.float32)
    full = tensorwire.serve.QueueFullError
    for _ in range(20):
        try:
            c.predict(x)
        except full:
            time.sleep(0.001)
    print("READY", flush=True)
    window = []
    def read():
        for line in sys.stdin:
            if line.startswith("START "):
                window[:] = [int(v) for v in line.split()[1:3]]
        os._exit(0)  # stdin closed: the parent is done with this client, or gone
    threading.Thread(target=read, daemon=True).start()
    lat, st = [], {"req": 0, "errs": 0, "cpu0": None}
    def before():
        # The time a prediction starts, None once the phase is over.
        t0 = time.time_ns()
        if window and t0 >= window[1]:
            return None
        if window and t0 >= window[0] and st["cpu0"] is None:
            st["cpu0"] = sum(os.times()[:2])
        return t0
    def after(t0):
        t1 = time.time_ns()
        if window and t0 >= window[0] and t1 < window[1]:
            st["req"] += 1
            lat.append(t1 - t0)
    if inflight == 1:  # a loop of predict, torch_spread's client
        while (t0 := before()) is not None:
            try:
                c.predict(x)
            except full:
                st["errs"] += 1
                time.sleep(0.001)
                continue
            after(t0)
    else:  # actors in one process: tasks awaiting apredict
        import asyncio
        async def actor():
            while (t0 := before()) is not None:
                try:
                    await c.apredict(x)
                except full:
                    st["errs"] += 1
                    await asyncio.sleep(0.001)
                    continue
                after(t0)
        async def actors():
            await asyncio.gather(*(actor() for _ in range(inflight)))
        asyncio.run(actors())
    cpu_ns = int((sum(os.times()[:2]) - st["cpu0"]) * 1e9) if st["cpu0"] is not None else -1
    print(json.dumps({"role": "client", "mode": mode, "requests": st["req"], "errors": st["errs"], "cpu_ns": cpu_ns,
                      "latencies_ns": lat}, separators=(",", ":")), flush=True)
    c.close()
elif cmd == "check":
    import tensorwire
    dev = sys.argv[6]
    m = module("py-mlp", dev)
    ok, total = 0, int(sys.argv[4])
    with tensorwire.serve.Client(sys.argv[2], sys.argv[5], root=sys.argv[3]) as c:
        rng = np.random.default_rng(0)
        for i in range(total):
            x = rng.normal(size=(1 + i % c.max_batch, 64)).astype(np.float32)
            out = c.predict({"obs": x}, timeout=60)["logits"]
            with torch.inference_mode():
                want = m(torch.from_numpy(x).to(dev)).cpu().numpy()
            ok += int(np.array_equal(out, want))
    print(f"{ok} {total}")
`

// python runs the Python side with args and returns its first line of
// output.
func (o *options) python(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, o.pythonExe, append([]string{"-c", pyScript}, args...)...)
	cmd.Env = o.pyEnv()
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("%s %s: %w: %s", o.pythonExe, args[0], err, lastLines(string(ee.Stderr), 10))
		}
		return "", fmt.Errorf("%s %s: %w (is --python a Python with torch, numpy and msgpack?)", o.pythonExe, args[0], err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}

// findPython sets o.pythonExe, when --python did not, to the first of
// python3 and /usr/bin/python3 that imports torch, numpy and msgpack; a
// usage error saying what was tried if none (or --python's) does.
func (o *options) findPython() error {
	c, err := benchkit.FindPython(o.pythonExe, "torch, numpy, msgpack")
	if err != nil {
		return usagef("Python replicas need a python3 with torch, numpy and msgpack (--python chooses it): %v", err)
	}
	o.pythonExe = c
	return nil
}

// extractPython writes this build's Python client into root/python, for
// the Python processes' PYTHONPATH.
func (o *options) extractPython(root string) error {
	dir := filepath.Join(root, "python")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	if err := python.Extract(dir); err != nil {
		return err
	}
	o.pyPath = dir
	return nil
}

// pyEnv is the Python processes' environment: PYTHONPATH starts with the
// extracted client.
func (o *options) pyEnv() []string {
	return benchkit.PythonEnv(o.pyPath)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pyLimit is limit for a Python model: the module called in-process, on
// one thread, in a Python process of its own.
func (o *options) pyLimit(ctx context.Context, model string) (float64, time.Duration, error) {
	line, err := o.python(ctx, "limit", model, strconv.Itoa(o.maxBatch), strconv.FormatFloat(o.limitDur.Seconds(), 'f', 3, 64), o.device)
	if err != nil {
		return 0, 0, err
	}
	var rows, ms float64
	if _, err := fmt.Sscanf(line, "%g %g", &rows, &ms); err != nil {
		return 0, 0, fmt.Errorf("the Python limit said %q", line)
	}
	return rows, time.Duration(ms * float64(time.Millisecond)), nil
}

// pyReplica is a replica process of a run; done is closed when it exits.
// A profiled one writes its report when stopped with SIGTERM.
type pyReplica struct {
	cmd      *exec.Cmd
	done     chan struct{}
	profiled bool
}

// pyReplicas are the replica processes of a run.
type pyReplicas []*pyReplica

// startReplicas starts o.replicas Python replicas of model attached to the
// node at addr, their output going to stderr (the run's, as the node's),
// and waits until the node counts them attached.
func (o *options) startReplicas(ctx context.Context, sc *serve.Client, addr, root, model, profile string, stderr io.Writer) (pyReplicas, error) {
	var rs pyReplicas
	for i := range o.replicas {
		profiled := profile != "" && i == 0
		args := []string{"-c", pyScript, "replica", addr, root, model, modelName, o.device, strconv.Itoa(o.window)}
		if profiled {
			args = append(args, profile)
		}
		cmd := exec.Command(o.pythonExe, args...)
		cmd.Stdout, cmd.Stderr, cmd.Env = nil, stderr, o.pyEnv()
		if err := cmd.Start(); err != nil {
			rs.stop()
			return nil, fmt.Errorf("starting a Python replica (%s): %w", o.pythonExe, err)
		}
		r := &pyReplica{cmd: cmd, done: make(chan struct{}), profiled: profiled}
		go func() { cmd.Wait(); close(r.done) }()
		rs = append(rs, r)
	}
	exited := func() error {
		for _, r := range rs {
			select {
			case <-r.done:
				return fmt.Errorf("a Python replica (%s) exited before it attached: %v", o.pythonExe, r.cmd.ProcessState)
			default:
			}
		}
		return nil
	}
	n, err := pollAttached(ctx, sc, readyTimeout, 50*time.Millisecond, func(n int) bool { return n >= o.replicas }, exited)
	if errors.Is(err, errPollTimeout) {
		err = fmt.Errorf("%d of %d Python replicas attached within %v", n, o.replicas, readyTimeout)
	}
	if err != nil {
		rs.stop()
		return nil, err
	}
	return rs, nil
}

// errPollTimeout is pollAttached's error when its condition did not come
// to hold in time.
var errPollTimeout = errors.New("timed out")

// pollAttached polls the node's count of attached replicas every interval
// until done holds for it, then returns it. It gives up with the Stats
// call's error, failed's (checked after each count that does not satisfy
// done; nil never fails), ctx's, or errPollTimeout after timeout, each
// beside the last count seen.
func pollAttached(ctx context.Context, sc *serve.Client, timeout, interval time.Duration, done func(n int) bool, failed func() error) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := sc.Stats(ctx)
		if err != nil {
			return 0, err
		}
		if done(st.AttachedNow) {
			return st.AttachedNow, nil
		}
		if failed != nil {
			if err := failed(); err != nil {
				return st.AttachedNow, err
			}
		}
		if time.Now().After(deadline) {
			return st.AttachedNow, errPollTimeout
		}
		select {
		case <-ctx.Done():
			return st.AttachedNow, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// cpu returns the replicas' CPU time so far; -1 if unknown.
func (rs pyReplicas) cpu() time.Duration {
	var total time.Duration
	for _, r := range rs {
		t := procCPU(r.cmd.Process.Pid)
		if t < 0 {
			return -1
		}
		total += t
	}
	return total
}

// waitDetached waits, up to 10 s, until the node counts no attached
// replica (it notices a killed one's connection close on its own time).
// It reports nothing: a run goes on to stop the node either way.
func waitDetached(ctx context.Context, sc *serve.Client) {
	pollAttached(ctx, sc, 10*time.Second, 10*time.Millisecond, func(n int) bool { return n == 0 }, nil)
}

// stop kills the replicas and waits for them; stopping them again does
// nothing. A profiled replica gets SIGTERM first and 10 s to write its
// report.
func (rs pyReplicas) stop() {
	for _, r := range rs {
		if r.profiled {
			r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(10 * time.Second):
			}
		}
		r.cmd.Process.Kill()
		<-r.done
	}
}

// check predicts through the node's Python MLP replicas and returns how
// many of n batches came back bit-equal to the module called directly.
func (o *options) pyCheck(ctx context.Context, addr, root string, n int) (int, error) {
	line, err := o.python(ctx, "check", addr, root, strconv.Itoa(n), modelName, o.device)
	if err != nil {
		return 0, err
	}
	var ok, total int
	if _, err := fmt.Sscanf(line, "%d %d", &ok, &total); err != nil || total != n {
		return 0, fmt.Errorf("the Python check said %q", line)
	}
	return ok, nil
}
