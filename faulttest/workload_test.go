package faulttest

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The workload: writers extend a replay buffer with transitions that carry
// their identity in every field, and a trainer samples and checks that
// every row it gets is whole. A transition's id is
//
//	(writer+1)<<40 | incarnation<<20 | sequence
//
// (an incarnation is one run of a writer process; a writer killed and
// restarted comes back as the next), and its "obs" row is obsWidth copies
// of the id. A row whose obs disagrees with its id is torn.
//
// Writers log to a file, one write(2) per line, which outlives a kill -9:
// "begin FIRST N" before an Extend and "ack FIRST N" after it returned nil
// (the batch is in the buffer exactly once), so the test knows at the end
// which transitions were acknowledged and which were in flight.
const obsWidth = 32

func transitionID(writer, inc, seq int) int64 {
	return int64(writer+1)<<40 | int64(inc)<<20 | int64(seq)
}

// transitions returns the batch of ids first, first+1, ...
func transitions(first int64, n int) *tensordict.TensorDict {
	ids := make([]int64, n)
	obs := make([]int64, n*obsWidth)
	for i := range ids {
		ids[i] = first + int64(i)
		for j := range obsWidth {
			obs[i*obsWidth+j] = ids[i]
		}
	}
	td, _ := tensordict.New(n)
	idT, _ := tensordict.FromSlice(ids, n)
	obsT, _ := tensordict.FromSlice(obs, n, obsWidth)
	td.Set("id", idT)
	td.Set("obs", obsT)
	return td
}

// tornRows counts the rows of a sampled batch whose fields disagree.
func tornRows(td *tensordict.TensorDict) (int, error) {
	idT, err := td.Tensor("id")
	if err != nil {
		return 0, err
	}
	obsT, err := td.Tensor("obs")
	if err != nil {
		return 0, err
	}
	ids, err := tensordict.Values[int64](idT)
	if err != nil {
		return 0, err
	}
	obs, err := tensordict.Values[int64](obsT)
	if err != nil {
		return 0, err
	}
	torn := 0
	for i, id := range ids {
		for j := range obsWidth {
			if obs[i*obsWidth+j] != id || id>>40 == 0 {
				torn++
				break
			}
		}
	}
	return torn, nil
}

func init() {
	roles["writer"] = runWriter
	roles["trainer"] = runTrainer
}

// clientFlags are what writers and trainers share.
type clientFlags struct {
	addr, name, root, tokenFile string
	batch                       int
	callTimeout                 time.Duration
}

func (f *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "", "the buffer node")
	fs.StringVar(&f.name, "name", "rb", "the buffer's name")
	fs.StringVar(&f.root, "root", "", "the shared root; empty: bytes mode")
	fs.StringVar(&f.tokenFile, "token-file", "", "the shared secret")
	fs.IntVar(&f.batch, "batch", 32, "transitions per call")
	fs.DurationVar(&f.callTimeout, "call-timeout", 0, "each call's deadline; 0: none")
}

// dial connects to the buffer, trying again until ctx ends: a helper
// restarted while the node is down waits for it.
func (f *clientFlags) dial(ctx context.Context) (*replay.Client, error) {
	token, err := nodeproc.ReadToken(f.tokenFile)
	if err != nil {
		return nil, err
	}
	opts := []replay.DialOption{replay.WithRPC(rpc.WithToken(token))}
	if f.root != "" {
		opts = append(opts, replay.WithRoot(f.root))
	}
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := replay.Dial(dctx, f.addr, f.name, opts...)
		cancel()
		if err == nil || !errors.Is(err, rpc.ErrUnavailable) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// connect dials, prints "ready MODE" and reports the calls' stats until
// ctx ends; done prints the last stat line and closes the client.
func (f *clientFlags) connect(ctx context.Context) (_ *replay.Client, _ *callStats, done func(), _ error) {
	c, err := f.dial(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	fmt.Println("ready", map[bool]string{true: "ref", false: "bytes"}[c.SharedFS()])
	st := new(callStats)
	stop := st.report(ctx)
	return c, st, func() { stop(); c.Close() }, nil
}

// callStats counts a helper's calls and how each ended, and is printed as
// a "stat" line: "stat calls=N ok=N unavailable=N other=N rows=N torn=N
// max_over_ms=F ep=E t=T last_err=...".
type callStats struct {
	mu                            sync.Mutex
	calls, ok, unavailable, other int
	rows, torn                    int
	maxOver                       time.Duration // longest a failed call ran past its deadline
	lastErr                       string
	ep, t                         int64 // an actor's episode and step in progress (episodes_test.go)
}

// setProgress notes the episode and step an actor's next call appends.
func (s *callStats) setProgress(ep int64, t int) {
	s.mu.Lock()
	s.ep, s.t = ep, int64(t)
	s.mu.Unlock()
}

// record counts one call that started at start and took took, with its
// deadline d (0: none). A failed call is also printed, as "fail START END
// KIND" (Unix microseconds; KIND unavailable, deadline or the code), so
// that a test can tell when each failed.
func (s *callStats) record(err error, start time.Time, took, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	kind := ""
	switch {
	case err == nil:
		s.ok++
		return
	case errors.Is(err, rpc.ErrUnavailable):
		s.unavailable++
		kind = "unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		s.other++
		kind = "deadline"
	default:
		s.other++
		kind = rpc.CodeOf(err).String()
	}
	fmt.Printf("fail %d %d %s\n", start.UnixMicro(), start.Add(took).UnixMicro(), kind)
	s.lastErr = strings.ReplaceAll(err.Error(), "\n", " ")
	if d > 0 && took-d > s.maxOver {
		s.maxOver = took - d
	}
}

func (s *callStats) line() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("stat calls=%d ok=%d unavailable=%d other=%d rows=%d torn=%d max_over_ms=%.1f ep=%d t=%d last_err=%s",
		s.calls, s.ok, s.unavailable, s.other, s.rows, s.torn, float64(s.maxOver)/1e6, s.ep, s.t, s.lastErr)
}

// report prints a stat line every 100 ms until ctx ends, and once more.
func (s *callStats) report(ctx context.Context) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fmt.Println(s.line())
			}
		}
	}()
	return func() { <-done; fmt.Println(s.line()) }
}

// parseStat reads a stat line's fields.
func parseStat(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	if i := strings.Index(line, "last_err="); i >= 0 {
		m["last_err"] = line[i+len("last_err="):]
	}
	return m
}

func statInt(m map[string]string, k string) int {
	n, _ := strconv.Atoi(m[k])
	return n
}

// runWriter is the writer role: it extends the buffer with batches of
// new transitions until -count are acknowledged or it is stopped, pausing
// -pace between batches, and logs each batch to -log.
func runWriter(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("writer", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	writer := fs.Int("writer", 0, "this writer's number")
	inc := fs.Int("inc", 0, "this run's incarnation")
	logPath := fs.String("log", "", "the batch log")
	count := fs.Int("count", 1<<20-1, "transitions to write")
	pace := fs.Duration("pace", 0, "pause between batches")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logf, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	c, st, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	for seq := 0; seq+cf.batch <= *count && ctx.Err() == nil; seq += cf.batch {
		first := transitionID(*writer, *inc, seq)
		if _, err := fmt.Fprintf(logf, "begin %d %d\n", first, cf.batch); err != nil {
			return err
		}
		cctx, cancel := callContext(ctx, cf.callTimeout)
		start := time.Now()
		_, err := c.Extend(cctx, transitions(first, cf.batch))
		took := time.Since(start)
		cancel()
		if ctx.Err() != nil {
			break // stopped: this batch's fate is unknown, as if killed
		}
		st.record(err, start, took, cf.callTimeout)
		if err == nil {
			if _, err := fmt.Fprintf(logf, "ack %d %d\n", first, cf.batch); err != nil {
				return err
			}
		}
		if *pace > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(*pace):
			}
		}
	}
	return nil
}

// runTrainer is the trainer role: it samples -batch transitions at a time
// until stopped, and counts torn rows.
func runTrainer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("trainer", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, st, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	for ctx.Err() == nil {
		cctx, cancel := callContext(ctx, cf.callTimeout)
		start := time.Now()
		td, _, err := c.Sample(cctx, cf.batch)
		took := time.Since(start)
		cancel()
		if ctx.Err() != nil {
			break
		}
		st.record(err, start, took, cf.callTimeout)
		if err != nil {
			time.Sleep(10 * time.Millisecond) // an empty buffer answers at once
			continue
		}
		torn, err := tornRows(td)
		if err != nil {
			return err
		}
		st.mu.Lock()
		st.rows += td.BatchSize()[0]
		st.torn += torn
		st.mu.Unlock()
	}
	return nil
}

func callContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// batchLog is what the writers' logs say: the batches begun and the ones
// acknowledged, by first id.
type batchLog struct {
	begun map[int64]int // first id -> transitions
	acked map[int64]bool
}

func readBatchLogs(paths ...string) (*batchLog, error) {
	l := &batchLog{begun: map[int64]int{}, acked: map[int64]bool{}}
	for _, p := range paths {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var first int64
			var n int
			kind, rest, _ := strings.Cut(sc.Text(), " ")
			if _, err := fmt.Sscanf(rest, "%d %d", &first, &n); err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %q: %w", p, sc.Text(), err)
			}
			switch kind {
			case "begin":
				l.begun[first] = n
			case "ack":
				if l.begun[first] != n {
					f.Close()
					return nil, fmt.Errorf("%s: ack of %d with no begin", p, first)
				}
				l.acked[first] = true
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// acked returns the number of acknowledged transitions.
func (l *batchLog) ackedRows() int {
	n := 0
	for first := range l.acked {
		n += l.begun[first]
	}
	return n
}

// heldIDs returns the id of every committed transition in the buffer at
// prefix, read from its files as docs/replay.md describes them: the slot
// table (state 2 is committed) and the storage's "id" column.
func heldIDs(prefix string) ([]int64, error) {
	td, err := tensordict.LoadMemmap(filepath.Join(prefix, "storage"))
	if err != nil {
		return nil, err
	}
	defer td.Close()
	idT, err := td.Tensor("id")
	if err != nil {
		return nil, err
	}
	ids, err := tensordict.Values[int64](idT)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(prefix, replay.SlotsFile))
	if err != nil {
		return nil, err
	}
	if len(b) != 32*len(ids) {
		return nil, fmt.Errorf("slot table of %d bytes for %d slots", len(b), len(ids))
	}
	var held []int64
	for i, id := range ids {
		word := uint64(b[32*i]) | uint64(b[32*i+1])<<8 // the state is in the low bits
		if word&3 == 2 {
			held = append(held, id)
		}
	}
	return held, nil
}

// verdict compares what a buffer holds with what its writers logged.
type verdict struct {
	Acked      int // transitions acknowledged
	Held       int // committed transitions in the buffer
	Lost       int // acknowledged, not held: must be 0
	Duplicated int // held more than once: must be 0
	Unknown    int // held, never begun by any writer: must be 0
	Partial    int // unacknowledged batches held in part: must be 0
	InFlight   int // unacknowledged batches held whole (committed, the writer killed before it heard)
}

func (v verdict) ok() bool {
	return v.Lost == 0 && v.Duplicated == 0 && v.Unknown == 0 && v.Partial == 0 && v.Acked > 0
}

func judge(l *batchLog, held []int64) verdict {
	v := verdict{Acked: l.ackedRows(), Held: len(held)}
	seen := map[int64]bool{}
	perBatch := map[int64]int{} // unacked batches: transitions held
	// Batches never overlap: an id belongs to the batch with the largest
	// first id not above it, if it is within that batch.
	firsts := slices.Sorted(maps.Keys(l.begun))
	for _, id := range held {
		if seen[id] {
			v.Duplicated++
			continue
		}
		seen[id] = true
		i, exact := slices.BinarySearch(firsts, id)
		if !exact {
			i--
		}
		if i < 0 || id >= firsts[i]+int64(l.begun[firsts[i]]) {
			v.Unknown++
			continue
		}
		if !l.acked[firsts[i]] {
			perBatch[firsts[i]]++
		}
	}
	for first := range l.acked {
		for i := range l.begun[first] {
			if !seen[first+int64(i)] {
				v.Lost++
			}
		}
	}
	for first, n := range perBatch {
		if n == l.begun[first] {
			v.InFlight++
		} else {
			v.Partial++
		}
	}
	return v
}
