package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/tensordict"
)

// modelName is the name the node serves the model under.
const modelName = "bench"

// The lines a client prints: readyLine once it has dialed and warmed up,
// then its result, one line of JSON starting with resultPrefix.
var (
	readyLine    = "READY"
	resultPrefix = []byte(`{"role":`)
)

// clientResult is a client's report of its timed phase.
type clientResult struct {
	Role     string         `json:"role"`
	Mode     string         `json:"mode"`
	Requests int64          `json:"requests"` // predictions started and finished within the phase
	Errors   int64          `json:"errors"`   // refused with ErrQueueFull (retried)
	CPUNS    int64          `json:"cpu_ns"`   // this process's CPU time (user and system) in the phase; -1: unknown
	Latency  report.Latency `json:"latency"`
	// LatenciesNS: a Python client's latencies, each in ns (it has no
	// histogram of report's; the parent records them into Latency).
	LatenciesNS []int64 `json:"latencies_ns,omitempty"`
}

// runNode is the node role: it serves the model as modelName until ctx
// ends (SIGTERM, or its parent gone), loading new parameters every
// --update-every with --update.
func runNode(ctx context.Context, o *options, stdout io.Writer, log *slog.Logger) error {
	if o.child {
		cctx, stop := nodeproc.ChildContext()
		defer stop()
		defer context.AfterFunc(ctx, stop)()
		ctx = cctx
	}
	stopProfile, err := startProfile(o.profileTo)
	if err != nil {
		return err
	}
	defer stopProfile()
	build, params, err := newModel(o.model)
	if err != nil {
		return usagef("--run-model: %v", err)
	}
	m, err := serve.New(serve.Config{
		Input: schemaIn(), Output: schemaOut(), MaxBatch: o.maxBatch, Replicas: o.replicas,
		New: build, Log: log, AttachedOnly: isPython(o.model), Policy: o.policy(),
	})
	if err != nil {
		return err
	}
	defer m.Close()
	if params != nil {
		if _, err := m.Load(ctx, params); err != nil {
			return err
		}
	}
	if o.update {
		var sets [2]*tensordict.TensorDict
		for i := range sets {
			if sets[i], err = fakeParams(o.updateMB, uint64(i)); err != nil {
				return err
			}
		}
		go updateEvery(ctx, m, sets, o.updateEvery, log)
	}
	var svc *serve.Service
	err = nodeproc.Run(ctx, nodeproc.Config{
		Listen: "127.0.0.1:0", Root: o.root, Log: log,
		Register: func(s *rpc.Server) (err error) {
			if svc, err = serve.Register(s); err != nil {
				return err
			}
			return svc.Add(modelName, m)
		},
	}, func(addr string) { fmt.Fprintln(stdout, nodeproc.ListeningPrefix+addr) })
	if svc != nil {
		svc.Close()
	}
	return err
}

// updateEvery loads sets[0], sets[1], sets[0], ... into m every d until ctx
// ends. A set is loaded again only after the next one's Load returned, so
// no model still uses it.
func updateEvery(ctx context.Context, m *serve.Manager, sets [2]*tensordict.TensorDict, d time.Duration, log *slog.Logger) {
	t := time.NewTicker(d)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		v, err := m.Load(ctx, sets[i%2])
		if err != nil {
			if ctx.Err() == nil {
				log.Error("loading parameters", "err", err)
			}
			return
		}
		log.Info("parameters loaded", "version", v, "took", time.Since(start))
	}
}

// runClient is the client role: it dials the model, predicts one row at a
// time in a loop, prints readyLine after a warm-up, and times the
// predictions between the start and end its parent sends on stdin
// ("START unix-ns unix-ns"), then prints its result. It stops early on
// SIGTERM or when stdin closes.
func runClient(ctx context.Context, o *options, stdout io.Writer, log *slog.Logger) error {
	signal.Ignore(os.Interrupt)
	stopProfile, err := startProfile(o.profileTo)
	if err != nil {
		return err
	}
	defer stopProfile()
	if o.clientProcs > 0 {
		runtime.GOMAXPROCS(o.clientProcs)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	window := make(chan [2]time.Time, 1)
	go readStart(os.Stdin, window, stop)

	opts := []serve.DialOption{serve.WithRoot(o.root)}
	if o.mode == modeBytes {
		opts = append(opts, serve.WithBytes())
	}
	c, err := serve.Dial(ctx, o.addr, modelName, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Mode() != o.mode {
		return fmt.Errorf("the client works in mode %s, not %s: does it share the node's root?", c.Mode(), o.mode)
	}
	in, err := inputRows(1, o.seed)
	if err != nil {
		return err
	}
	predict := func() error {
		for {
			_, _, err := c.Predict(ctx, in)
			if !errors.Is(err, serve.ErrQueueFull) {
				return err
			}
			time.Sleep(time.Millisecond) // back off, as a client of a full queue should
		}
	}
	for range 20 {
		if err := predict(); err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, readyLine)

	// The timed phase: --in-flight workers predict in a loop from now on;
	// those that start and finish within the parent's window count.
	var phase atomic.Pointer[[2]time.Time]
	parts := make([]clientResult, o.inFlight)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, len(parts)) // the first worker's error first
	var wg sync.WaitGroup
	for k := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := predictLoop(wctx, c, in, &phase, &parts[k]); err != nil {
				failed <- err
				cancel()
			}
		}()
	}
	res := clientResult{Role: roleClient, Mode: o.mode, CPUNS: -1}
	var cpu0 time.Duration
	select {
	case w := <-window:
		phase.Store(&w)
		select {
		case <-time.After(time.Until(w[0])):
			cpu0 = benchkit.ProcessCPU()
		case <-wctx.Done():
		}
	case <-wctx.Done():
	}
	wg.Wait()
	close(failed)
	if err := <-failed; err != nil {
		return err
	}
	if c1 := benchkit.ProcessCPU(); cpu0 > 0 && c1 >= 0 {
		res.CPUNS = int64(c1 - cpu0)
	}
	for k := range parts {
		res.Requests += parts[k].Requests
		res.Errors += parts[k].Errors
		res.Latency.Merge(&parts[k].Latency)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

// predictLoop predicts in in a loop until the phase's end, counting into
// res the predictions started and finished within it (and the refusals
// of a full queue, retried after a millisecond).
func predictLoop(ctx context.Context, c *serve.Client, in *tensordict.TensorDict, phase *atomic.Pointer[[2]time.Time], res *clientResult) error {
	for {
		w := phase.Load()
		t0 := time.Now()
		if w != nil && !t0.Before(w[1]) {
			return nil
		}
		_, _, err := c.Predict(ctx, in)
		if errors.Is(err, serve.ErrQueueFull) {
			res.Errors++
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
		if t1 := time.Now(); w != nil && !t0.Before(w[0]) && t1.Before(w[1]) {
			res.Requests++
			res.Latency.Record(t1.Sub(t0))
		}
	}
}

// readStart reads the parent's "START s e" line from r into window, then
// calls stop when r ends (the parent closed it, or died).
func readStart(r io.Reader, window chan<- [2]time.Time, stop func()) {
	defer stop()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var s, e int64
		if _, err := fmt.Sscanf(sc.Text(), "START %d %d", &s, &e); err == nil {
			window <- [2]time.Time{time.Unix(0, s), time.Unix(0, e)}
		}
	}
}

// startProfile starts a CPU profile to path (none when path is empty) and
// returns what stops it.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// policy is the node's batching policy: --max-delay's, for a batching
// run (the runs of max batch 1 have nothing to wait for).
func (o *options) policy() serve.Policy {
	if o.maxBatch <= 1 {
		return serve.Greedy()
	}
	return serve.MaxDelay(o.maxDelay)
}
