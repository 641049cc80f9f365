package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Each role runs in its own process and ends by printing its results as
// one line of JSON on stdout, starting with resultPrefix. Latencies travel
// as HdrHistograms (report.Latency), which the parent merges.
var resultPrefix = []byte(`{"role":`)

const (
	dialTimeout  = 30 * time.Second
	heapInterval = 500 * time.Millisecond
)

// writerResult is a writer's report.
type writerResult struct {
	Role              string `json:"role"`
	Mode              string `json:"mode"`
	Sharing           string `json:"sharing,omitempty"` // with the node, at Dial (rpc.Sharing)
	Index             int    `json:"index"`
	FillNS            int64  `json:"fill_ns"`            // to write its share of the capacity once
	WarmupNS          int64  `json:"warmup_ns"`          // to write it warmLaps times
	WarmupTransitions int64  `json:"warmup_transitions"` // warmLaps times its share, in whole batches
	ElapsedNS         int64  `json:"elapsed_ns"`         // of its timed phase
	Transitions       int64  `json:"transitions"`        // extended in the timed phase

	Extend report.Latency `json:"extend_latency"` // every timed Extend's latency
}

// trainerResult is the trainer's report.
type trainerResult struct {
	Role              string  `json:"role"`
	Mode              string  `json:"mode"`
	Sharing           string  `json:"sharing,omitempty"`               // with the node, at Dial (rpc.Sharing)
	MemcpyGatherPerS  float64 `json:"memcpy_gather_transitions_per_s"` // 0: not measured (no --root)
	WarmupTransitions int64   `json:"warmup_transitions"`              // sampled, untimed, during the warm-up
	ElapsedNS         int64   `json:"elapsed_ns"`                      // of its timed phase
	Transitions       int64   `json:"transitions"`                     // sampled in the timed phase
	RowsVerified      int64   `json:"rows_verified"`                   // warm-up and timed
	TornRows          int64   `json:"torn_rows"`                       // of those, rows that were not one whole transition
	FirstTorn         string  `json:"first_torn,omitempty"`
	Resampled         int64   `json:"resampled"`      // timed: rows the node sampled beyond those returned
	NodeResampled     int64   `json:"node_resampled"` // timed: Stats.Resampled's increase
	HeapMaxBytes      uint64  `json:"heap_max_bytes"` // the largest Stats.NodeHeap polled in the timed phase
	HeapPolls         int     `json:"heap_polls"`

	Sample report.Latency `json:"sample_latency"` // every timed SampleInto's latency
}

// bufferResult is the buffer node's report.
type bufferResult struct {
	Role                 string       `json:"role"`
	Name                 string       `json:"name"`
	DoneCheckpointNS     int64        `json:"done_checkpoint_ns"`     // the checkpoint once the run was done; 0 if it never was
	ShutdownCheckpointNS int64        `json:"shutdown_checkpoint_ns"` // the one on shutdown
	Stats                replay.Stats `json:"stats"`                  // at shutdown
}

func printResult(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// runBuffer is the buffer role: it creates the buffer at ROOT/NAME, serves
// it and the run's barrier as a node until ctx ends, checkpointing once
// the participants are done, and then checkpoints, closes the buffer and
// reports.
func runBuffer(ctx context.Context, o *options, stdout, stderr io.Writer, log *slog.Logger) (err error) {
	prefix := filepath.Join(o.root, o.name)
	b, err := replay.Create(prefix, replay.Config{
		Capacity: o.capacity,
		Schema:   Schema(),
		Sampler:  replay.Uniform(),
		Writer:   replay.RoundRobin(),
		Limit:    replay.RateLimit{MinSize: o.minSize},
	})
	if err != nil {
		return err
	}
	res := bufferResult{Role: roleBuffer, Name: o.name}
	defer func() {
		if cerr := b.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the buffer: %w", cerr)
		}
		if err == nil {
			err = printResult(stdout, res)
		}
	}()
	log.Info("buffer created", "prefix", prefix, "capacity", o.capacity,
		"storage_bytes", int64(o.capacity)*TransitionBytes, "min_size", o.minSize)

	coord := newCoordinator(o.writers, o.capacity, o.duration)
	serving, stopServing := context.WithCancel(ctx) // ends when the node stops
	defer stopServing()
	checkpointed := make(chan error, 1)
	go func() {
		select {
		case <-coord.finished:
		case <-serving.Done():
			checkpointed <- nil
			return
		}
		start := time.Now()
		err := b.Checkpoint(context.Background())
		res.DoneCheckpointNS = int64(time.Since(start))
		log.Info("run done; checkpointed", "seconds", time.Duration(res.DoneCheckpointNS).Seconds(), "err", err)
		checkpointed <- err
	}()
	go printProgress(serving, stderr, b, coord)

	err = nodeproc.Run(ctx, nodeproc.Config{
		Listen:    o.listen,
		Root:      o.root,
		TokenFile: o.tokenFile,
		Log:       log,
		Register: func(s *rpc.Server) error {
			svc, err := replay.Register(s)
			if err != nil {
				return err
			}
			if err := svc.Add(o.name, b); err != nil {
				return err
			}
			return coord.register(s)
		},
	}, func(addr string) { fmt.Fprintln(stdout, nodeproc.ListeningPrefix+addr) })
	stopServing()
	if cerr := <-checkpointed; err == nil && cerr != nil {
		err = fmt.Errorf("checkpoint after the run: %w", cerr)
	}
	start := time.Now()
	if cerr := b.Checkpoint(context.Background()); err == nil && cerr != nil {
		err = fmt.Errorf("checkpoint on shutdown: %w", cerr)
	}
	res.ShutdownCheckpointNS = int64(time.Since(start))
	res.Stats, _ = b.Stats() // open until the deferred Close
	return err
}

// join connects a writer or trainer (o.role) to the buffer, in its mode,
// and to the node for the barrier, and joins the run (phaseStart).
func join(ctx context.Context, o *options) (*replay.Client, *rpc.Client, barrierResponse, error) {
	c, rc, err := dial(ctx, o)
	if err != nil {
		return nil, nil, barrierResponse{}, err
	}
	run, err := callBarrier(ctx, rc, barrierRequest{Phase: phaseStart, Role: o.role, Mode: modeOf(c)})
	if err != nil {
		c.Close()
		rc.Close()
		return nil, nil, barrierResponse{}, fmt.Errorf("joining the run: %w", err)
	}
	return c, rc, run, nil
}

// dial connects a writer or trainer to the buffer, in its mode, and to the
// node for the barrier.
func dial(ctx context.Context, o *options) (*replay.Client, *rpc.Client, error) {
	var ropts []rpc.Option
	if o.tokenFile != "" {
		token, err := nodeproc.ReadToken(o.tokenFile)
		if err != nil {
			return nil, nil, err
		}
		ropts = append(ropts, rpc.WithToken(token))
	}
	dopts := []replay.DialOption{replay.WithRPC(ropts...)}
	if o.root != "" {
		dopts = append(dopts, replay.WithRoot(o.root))
	}
	if o.mode == modeBytes {
		dopts = append(dopts, replay.WithBytes())
	}
	if o.role == roleTrainer && o.prefetch {
		dopts = append(dopts, replay.WithPrefetch())
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	c, err := replay.Dial(dctx, o.addr, o.name, dopts...)
	if err != nil {
		return nil, nil, fmt.Errorf("dialing buffer %q at %s: %w", o.name, o.addr, err)
	}
	if o.mode == modeRef && c.Sharing() == rpc.Storage {
		// The node's files through another page cache (another machine on
		// NFS, another FUSE mount): references would read stale rows, and
		// the client went by bytes by itself. The run goes on so.
		fmt.Fprintf(os.Stderr, "%s: --root %s holds the node's files but not its page cache (sharing: storage): rows travel as bytes\n", o.role, o.root)
		o.mode = modeBytes
	}
	if modeOf(c) != o.mode {
		c.Close()
		return nil, nil, fmt.Errorf("the client works in mode %q, not %q (sharing with the node: %s): is --root %q the node's shared root?", modeOf(c), o.mode, c.Sharing(), o.root)
	}
	rc, err := rpc.Dial(dctx, o.addr, ropts...)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("dialing %s: %w", o.addr, err)
	}
	return c, rc, nil
}

// warmLaps is how many times over the writers write the capacity in the
// warm-up. The first lap writes every slot, so that every page of the
// storage is in the page cache; the others map the pages into each
// writer's own mapping too (a writer writes about half the slots of a lap
// with two writers, and not the same half every lap), so that the timed
// phase does not start with a ramp of page faults.
const warmLaps = 4

// runWriter is a writer: it joins the run, writes its share of the
// capacity warmLaps times (the warm-up), waits for the timed phase, and
// extends batches for the run's duration as fast as it can.
func runWriter(ctx context.Context, o *options, stdout io.Writer, log *slog.Logger) error {
	c, rc, run, err := join(ctx, o)
	if err != nil {
		return err
	}
	defer c.Close()
	defer rc.Close()
	log = log.With("writer", run.Index)
	bt, err := newBatch(o.batch)
	if err != nil {
		return err
	}
	res := writerResult{Role: roleWriter, Mode: modeOf(c), Sharing: c.Sharing().String(), Index: run.Index}
	var seq uint64
	next := func() { // makes bt the next bt.n transitions of this writer
		for i := range bt.n {
			bt.stamp(i, transitionID(run.Index, seq))
			seq++
		}
	}

	share := int64((run.Capacity + run.Writers - 1) / run.Writers)
	start := time.Now()
	for res.WarmupTransitions < warmLaps*share {
		next()
		if _, err := c.Extend(ctx, bt.td); err != nil {
			return fmt.Errorf("warm-up: extend: %w", err)
		}
		res.WarmupTransitions += int64(bt.n)
		if res.FillNS == 0 && res.WarmupTransitions >= share {
			res.FillNS = int64(time.Since(start))
		}
	}
	res.WarmupNS = int64(time.Since(start))
	log.Info("warm-up written", "transitions", res.WarmupTransitions, "seconds", time.Duration(res.WarmupNS).Seconds(),
		"first_fill_seconds", time.Duration(res.FillNS).Seconds())
	for _, p := range []string{phaseFilled, phaseTimed} {
		if _, err := callBarrier(ctx, rc, barrierRequest{Phase: p}); err != nil {
			return fmt.Errorf("waiting for phase %s: %w", p, err)
		}
	}

	d := time.Duration(run.DurationNS)
	start = time.Now()
	// With --insert-rate each writer paces itself to its share of it: batch
	// k starts no earlier than k batches' worth of time after the start.
	var every time.Duration
	if o.insertRate > 0 {
		every = time.Duration(float64(time.Second) * float64(bt.n) * float64(run.Writers) / o.insertRate)
	}
	for k := 0; time.Since(start) < d; k++ {
		if every > 0 {
			if wait := time.Until(start.Add(time.Duration(k) * every)); wait > 0 {
				time.Sleep(wait)
			}
		}
		next()
		t0 := time.Now()
		if _, err := c.Extend(ctx, bt.td); err != nil {
			return fmt.Errorf("extend: %w", err)
		}
		res.Extend.Record(time.Since(t0))
		res.Transitions += int64(bt.n)
	}
	res.ElapsedNS = int64(time.Since(start))
	if _, err := callBarrier(ctx, rc, barrierRequest{Phase: phaseDone}); err != nil {
		return fmt.Errorf("waiting for phase %s: %w", phaseDone, err)
	}
	return printResult(stdout, res)
}

// verifier checks every row the trainer is given.
type verifier struct {
	log        *slog.Logger
	rows, torn int64
	first      string
}

// check verifies every row of b; it logs the first few torn rows.
func (v *verifier) check(b *batch) {
	for i := range b.n {
		v.rows++
		if _, err := b.verify(i); err != nil {
			v.torn++
			if v.first == "" {
				v.first = err.Error()
			}
			if v.torn <= 5 {
				v.log.Error("a sample returned a torn row", "err", err)
			}
		}
	}
}

// runTrainer is the trainer: it joins the run, samples untimed during the
// warm-up, measures the memcpy gather limit on its own mapping of the
// storage, then samples for the run's duration as fast as it can, polling
// the node's heap meanwhile. It verifies every row it is given.
func runTrainer(ctx context.Context, o *options, stdout io.Writer, log *slog.Logger) error {
	c, rc, run, err := join(ctx, o)
	if err != nil {
		return err
	}
	defer c.Close()
	defer rc.Close()
	dst, err := newBatch(o.sampleBatch)
	if err != nil {
		return err
	}
	res := trainerResult{Role: roleTrainer, Mode: modeOf(c), Sharing: c.Sharing().String()}
	v := &verifier{log: log}

	if err := warmSample(ctx, c, rc, dst, v, &res); err != nil {
		return err
	}
	if o.root != "" {
		storage, err := tensordict.LoadMemmap(filepath.Join(o.root, o.name, replay.StorageDir), tensordict.ReadOnly())
		if err != nil {
			return fmt.Errorf("mapping the storage for the memcpy limit: %w", err)
		}
		res.MemcpyGatherPerS, err = memcpyGather(storage, o.sampleBatch, o.memcpyDuration)
		storage.Close()
		if err != nil {
			return fmt.Errorf("memcpy limit: %w", err)
		}
		log.Info("memcpy gather limit", "transitions_per_s", int64(res.MemcpyGatherPerS))
	} else {
		log.Warn("no --root: the memcpy gather limit is not measured")
	}
	before, err := c.Stats(ctx)
	if err != nil {
		return err
	}
	if _, err := callBarrier(ctx, rc, barrierRequest{Phase: phaseTimed}); err != nil {
		return fmt.Errorf("waiting for phase %s: %w", phaseTimed, err)
	}

	hctx, stopHeap := context.WithCancel(ctx)
	heap := make(chan heapPoll, 1)
	go pollHeap(hctx, c, heapInterval, heap)
	d := time.Duration(run.DurationNS)
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if _, err = c.SampleInto(ctx, dst.td); err != nil {
			err = fmt.Errorf("sample: %w", err)
			break
		}
		res.Sample.Record(time.Since(t0))
		res.Transitions += int64(dst.n)
		v.check(dst)
	}
	res.ElapsedNS = int64(time.Since(start))
	stopHeap()
	hp := <-heap
	if err != nil {
		return err
	}
	if hp.err != nil {
		return hp.err
	}
	res.HeapMaxBytes, res.HeapPolls = hp.max, hp.polls
	after, err := c.Stats(ctx)
	if err != nil {
		return err
	}
	res.Resampled = after.Sampled - before.Sampled - res.Transitions
	res.NodeResampled = after.Resampled - before.Resampled
	if _, err := callBarrier(ctx, rc, barrierRequest{Phase: phaseDone}); err != nil {
		return fmt.Errorf("waiting for phase %s: %w", phaseDone, err)
	}
	res.RowsVerified, res.TornRows, res.FirstTorn = v.rows, v.torn, v.first
	return printResult(stdout, res)
}

// warmSample samples into dst, untimed, checking every row, until the
// writers have filled the buffer (the barrier's phaseFilled).
func warmSample(ctx context.Context, c *replay.Client, rc *rpc.Client, dst *batch, v *verifier, res *trainerResult) error {
	wctx, stop := context.WithCancel(ctx)
	sampled := make(chan error, 1)
	go func() {
		for {
			if _, err := c.SampleInto(wctx, dst.td); err != nil {
				if wctx.Err() != nil {
					err = nil
				}
				sampled <- err
				return
			}
			v.check(dst)
			res.WarmupTransitions += int64(dst.n)
		}
	}()
	_, err := callBarrier(ctx, rc, barrierRequest{Phase: phaseFilled})
	stop()
	serr := <-sampled
	switch {
	case err != nil:
		return fmt.Errorf("waiting for phase %s: %w", phaseFilled, err)
	case serr != nil:
		return fmt.Errorf("warm-up: sample: %w", serr)
	}
	return nil
}

// modeOf names how c works: "ref" (replay.Client.SharedFS) or "bytes".
func modeOf(c *replay.Client) string {
	return map[bool]string{true: "ref", false: "bytes"}[c.SharedFS()]
}
