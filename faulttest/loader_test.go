package faulttest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/internal/testkit/netns"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The loader across hosts (docs/loader.md, docs/reliability.md): a node
// serving a producer ("tensorwire node --loader ld,...") on host
// "loader", and four consumers on hosts of their own, with batch sizes of
// their own: "ref" (by reference, through the shared root), "bytes" (no
// root), "victim" (by reference) and "cut" (bytes). Every sample carries
// its index in its first and last 8 bytes, every other byte derived from
// it, and its label is the index, so each consumer checks every row it
// gets and counts every sample of every epoch it completes.
//
// The victim is killed with SIGKILL: the producer must drop it within the
// heartbeat period, and the others go on without an error. The cut
// consumer's host is cut off: the producer must drop it within the
// heartbeat period (and a reaper's tick) while the others go on without
// an error; reconnected, it is told, and completes epochs again. The
// node is killed with SIGKILL and started again on the same root: a
// consumer's loop in the middle of an epoch ends with Unavailable (or
// ErrDropped, once the new producer answers for another ring); one that
// had yielded nothing of its epoch yet waits for the node instead; every
// consumer then completes epochs again, each after the last epoch the
// killed producer began (its loader.json), never one it may have begun. Throughout, every epoch
// a consumer completes has every sample exactly once, no row is torn,
// and consumers that complete the same epoch saw its samples in the same
// order.

func init() {
	roles["loader-consumer"] = runLoaderConsumer
}

// The scenario's dataset and producer.
const (
	ldName      = "ld"
	ldSamples   = 4096
	ldRowBytes  = 64
	ldHeartbeat = 2 * time.Second  // 1 s once dropped a consumer starved that long in CI (heartbeats every 250 ms), not one cut off
	ldMaxWait   = 20 * time.Second // far beyond the heartbeat: a drop for silence is not one for slowness
)

// ldRow fills row with sample i: i in its first and last 8 bytes, byte
// (7i+3+j) mod 256 at j between.
func ldRow(row []byte, i int) {
	for j := range row {
		row[j] = byte(7*i + 3 + j)
	}
	binary.LittleEndian.PutUint64(row, uint64(i))
	binary.LittleEndian.PutUint64(row[len(row)-8:], uint64(i))
}

// makeLoaderDataset writes the scenario's dataset at prefix: "x" uint8
// [ldSamples, ldRowBytes] and "label" int64 [ldSamples].
func makeLoaderDataset(t *testing.T, prefix string) {
	t.Helper()
	td, err := tensordict.Create(prefix, []int{ldSamples},
		tensordict.Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{ldSamples, ldRowBytes}},
		tensordict.Field{Key: []string{"label"}, DType: memmap.Int64, Shape: []int{ldSamples}})
	if err != nil {
		t.Fatal(err)
	}
	x, _ := td.Tensor("x")
	lbl, _ := td.Tensor("label")
	xb, _ := x.Bytes()
	lb, _ := lbl.Bytes()
	for i := range ldSamples {
		ldRow(xb[i*ldRowBytes:(i+1)*ldRowBytes], i)
		binary.LittleEndian.PutUint64(lb[8*i:], uint64(i))
	}
	if err := td.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := td.Close(); err != nil {
		t.Fatal(err)
	}
}

// runLoaderConsumer joins the loader and iterates epochs until its
// context ends. It prints "ready MODE" once joined; after each epoch it
// completes "epoch E rows R dup D missing M torn T hash H" (H hashes the
// samples in the order they came); after each loop that ends with an
// error "err E KIND MESSAGE" (KIND: dropped, unavailable or other), and
// then tries again.
func runLoaderConsumer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("loader-consumer", flag.ContinueOnError)
	addr := fs.String("addr", "", "the loader's node")
	root := fs.String("root", "", "the shared root; empty: bytes")
	tokenFile := fs.String("token-file", "", "the shared secret")
	batch := fs.Int("batch", 32, "the consumer's batch size")
	step := fs.Duration("step", time.Millisecond, "a training step: the time spent on each batch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	token, err := nodeproc.ReadToken(*tokenFile)
	if err != nil {
		return err
	}
	opts := loader.Options{Batch: *batch, Root: *root, RPC: []rpc.Option{rpc.WithToken(token)}}
	var c *loader.Consumer
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err = loader.Dial(dctx, *addr, ldName, opts)
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, rpc.ErrUnavailable) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	defer c.Close()
	mode := "bytes"
	if c.SharedFS() {
		mode = "ref"
	}
	fmt.Println("ready", mode)
	seen := make([]int, ldSamples)
	for ctx.Err() == nil {
		clear(seen)
		h := fnv.New64a()
		rows, torn := 0, 0
		var loopErr error
		for b, err := range c.Batches(ctx) {
			if err != nil {
				loopErr = err
				break
			}
			x, err := b.Tensor("x")
			if err != nil {
				return err
			}
			xs, err := x.Bytes()
			if err != nil {
				return err
			}
			lbl, err := tensordict.Values[int64](mustLdTensor(b, "label"))
			if err != nil {
				return err
			}
			want := make([]byte, ldRowBytes)
			for r := range b.Len() {
				row := xs[r*ldRowBytes : (r+1)*ldRowBytes]
				id := int(binary.LittleEndian.Uint64(row))
				if id < 0 || id >= ldSamples {
					torn++
					continue
				}
				ldRow(want, id)
				if !slices.Equal(row, want) || lbl[r] != int64(id) {
					torn++
					continue
				}
				seen[id]++
				h.Write(row[:8])
			}
			rows += b.Len()
			time.Sleep(*step)
		}
		if loopErr != nil {
			if ctx.Err() != nil {
				return nil
			}
			kind := "other"
			switch {
			case errors.Is(loopErr, loader.ErrDropped):
				kind = "dropped"
			case errors.Is(loopErr, rpc.ErrUnavailable):
				kind = "unavailable"
			}
			fmt.Printf("err %d %s %s\n", c.Epoch(), kind, strings.ReplaceAll(loopErr.Error(), "\n", " "))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		dup, missing := 0, 0
		for _, n := range seen {
			switch {
			case n == 0:
				missing++
			case n > 1:
				dup++
			}
		}
		fmt.Printf("epoch %d rows %d dup %d missing %d torn %d hash %x\n", c.Epoch()-1, rows, dup, missing, torn, h.Sum64())
	}
	return nil
}

func mustLdTensor(td *tensordict.TensorDict, key string) *tensordict.Tensor {
	t, err := td.Tensor(key)
	if err != nil {
		panic(err)
	}
	return t
}

// ldEpoch is an "epoch" line of a consumer, or an "err" line (err set).
type ldEpoch struct {
	epoch                    int64
	rows, dup, missing, torn int
	hash                     string
	err                      string // "KIND MESSAGE"
}

// ldLines parses a consumer's output.
func ldLines(out string) []ldEpoch {
	var es []ldEpoch
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 12 && f[0] == "epoch":
			e := ldEpoch{hash: f[11]}
			e.epoch, _ = strconv.ParseInt(f[1], 10, 64)
			e.rows, _ = strconv.Atoi(f[3])
			e.dup, _ = strconv.Atoi(f[5])
			e.missing, _ = strconv.Atoi(f[7])
			e.torn, _ = strconv.Atoi(f[9])
			es = append(es, e)
		case len(f) >= 3 && f[0] == "err":
			e := ldEpoch{err: strings.Join(f[2:], " ")}
			e.epoch, _ = strconv.ParseInt(f[1], 10, 64)
			es = append(es, e)
		}
	}
	return es
}

// ldConsumer is a consumer process of the scenario.
type ldConsumer struct {
	name  string
	host  *netns.Host
	batch int
	ref   bool
	proc  *proctest.Proc
}

// lines returns the consumer's epochs and errors so far.
func (lc *ldConsumer) lines() []ldEpoch { return ldLines(lc.proc.Output()) }

// epochs returns how many epochs the consumer has completed.
func (lc *ldConsumer) epochs() int {
	n := 0
	for _, e := range lc.lines() {
		if e.err == "" {
			n++
		}
	}
	return n
}

// errs returns the consumer's errors after its first skip lines.
func (lc *ldConsumer) errsAfter(skip int) []ldEpoch {
	var out []ldEpoch
	for _, e := range lc.lines()[skip:] {
		if e.err != "" {
			out = append(out, e)
		}
	}
	return out
}

// ldStats asks the node at addr for the loader's Stats.
func ldStats(ctx context.Context, c *rpc.Client) (loader.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return rpc.Call[loader.Stats](ctx, c, loader.MethodStats, struct {
		Name string `codec:"name"`
	}{ldName})
}

func TestLoaderAcrossHosts(t *testing.T) {
	c := newCluster(t)
	nodeHost := c.host("loader")
	consumers := []*ldConsumer{
		{name: "ref", host: c.host("ref"), batch: 32, ref: true},
		{name: "bytes", host: c.host("bytes"), batch: 64},
		{name: "victim", host: c.host("victim"), batch: 16, ref: true},
		{name: "cut", host: c.host("cut"), batch: 48},
	}
	ref, bytesC, victim, cut := consumers[0], consumers[1], consumers[2], consumers[3]
	dataset := filepath.Join(c.shared, "data")
	makeLoaderDataset(t, dataset)
	nodeArgs := []string{"--loader", fmt.Sprintf("%s,dataset=%s,batch=32,slots=8,window=4,seed=11,heartbeat=%v,max-wait=%v",
		ldName, dataset, ldHeartbeat, ldMaxWait)}
	node := c.node(nodeHost, "", nodeArgs...)

	token, err := nodeproc.ReadToken(c.token)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stats, err := rpc.Dial(ctx, addr(nodeHost), rpc.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()

	start := func(lc *ldConsumer) {
		args := []string{"-addr", addr(nodeHost), "-token-file", c.token, "-batch", itoa(lc.batch)}
		if lc.ref {
			args = append(args, "-root", c.shared)
		}
		lc.proc = c.helper(lc.host, "loader-consumer", "loader consumer "+lc.name, args...)
		want := map[bool]string{true: "ref", false: "bytes"}[lc.ref]
		if mode := lc.proc.Expect(t, "ready"); mode != want {
			t.Fatalf("consumer %s runs in %s mode, want %s", lc.name, mode, want)
		}
	}
	for _, lc := range consumers {
		start(lc)
	}
	// progress waits until each of lcs has completed n more epochs than
	// at from (their line counts).
	progress := func(what string, n int, lcs ...*ldConsumer) {
		t.Helper()
		from := map[*ldConsumer]int{}
		for _, lc := range lcs {
			from[lc] = lc.epochs()
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			done := true
			for _, lc := range lcs {
				if !lc.proc.Alive() {
					t.Fatalf("%s: consumer %s exited: %v\n%s", what, lc.name, lc.proc.ExitErr(), lc.proc.Stderr())
				}
				done = done && lc.epochs() >= from[lc]+n
			}
			if done {
				return
			}
			if time.Now().After(deadline) {
				var got []string
				for _, lc := range lcs {
					got = append(got, fmt.Sprintf("%s %d (from %d)", lc.name, lc.epochs(), from[lc]))
				}
				t.Fatalf("%s: no %d epochs each in 2 minutes: %s", what, n, strings.Join(got, ", "))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// dropped waits until the producer has dropped one more consumer than
	// in before, and returns how long that took from since.
	dropped := func(what string, before loader.Stats, since time.Time) (time.Duration, loader.Stats) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, err := ldStats(ctx, stats)
			if err == nil && st.Dropped+st.DroppedSlow > before.Dropped+before.DroppedSlow {
				return time.Since(since), st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not dropped in 30 s: %+v, %v (before %+v)", what, st, err, before)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	progress("at the start", 2, consumers...)
	st0, err := ldStats(ctx, stats)
	if err != nil {
		t.Fatal(err)
	}
	if st0.Consumers != 4 {
		t.Fatalf("the producer counts %d consumers, want 4: %+v", st0.Consumers, st0)
	}

	// A consumer killed: dropped within the heartbeat period (its stream
	// breaks: at once), the others go on without an error.
	others := []*ldConsumer{ref, bytesC, cut}
	mark := map[*ldConsumer]int{}
	for _, lc := range others {
		mark[lc] = len(lc.lines())
	}
	killed := victim.proc.Kill()
	killDrop, st1 := dropped("the killed consumer", st0, killed)
	if killDrop > ldHeartbeat {
		t.Errorf("the killed consumer was dropped %v after the kill, past the heartbeat period %v", killDrop, ldHeartbeat)
	}
	if st1.DroppedSlow != st0.DroppedSlow || st1.Consumers != 3 {
		t.Errorf("after the kill: %+v, want 3 consumers and no drop for slowness", st1)
	}
	progress("after the kill", 2, others...)
	for _, lc := range others {
		if errs := lc.errsAfter(mark[lc]); len(errs) > 0 {
			t.Errorf("consumer %s after another was killed: %v", lc.name, errs)
		}
	}

	// A consumer's host cut off: dropped within the heartbeat period and
	// a reaper's tick; the others go on without an error.
	others = []*ldConsumer{ref, bytesC}
	for _, lc := range others {
		mark[lc] = len(lc.lines())
	}
	cutMark := len(cut.lines())
	if err := cut.host.Disconnect(); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	cutDrop, st2 := dropped("the cut-off consumer", st1, cutAt)
	if limit := ldHeartbeat + ldHeartbeat/4 + 500*time.Millisecond; cutDrop > limit {
		t.Errorf("the cut-off consumer was dropped %v after the cut, past %v (the heartbeat, a reaper's tick and 500 ms of slack)", cutDrop, limit)
	}
	if st2.DroppedSlow != st0.DroppedSlow || st2.Consumers != 2 {
		t.Errorf("after the cut: %+v, want 2 consumers and no drop for slowness", st2)
	}
	progress("while a consumer is cut off", 2, others...)
	time.Sleep(max(0, 4*time.Second-time.Since(cutAt)))
	if err := cut.host.Reconnect(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	progress("after the heal", 2, cut)
	healToEpoch := time.Since(healed)
	cutErrs := cut.errsAfter(cutMark)
	t.Logf("the cut-off consumer after the heal: %v", cutErrs)
	if len(cutErrs) == 0 {
		t.Errorf("the cut-off consumer was not told it was dropped")
	}
	for _, e := range cutErrs {
		if !strings.HasPrefix(e.err, "dropped") && !strings.HasPrefix(e.err, "unavailable") {
			t.Errorf("the cut-off consumer: %q, want dropped or unavailable", e.err)
		}
	}
	for _, lc := range others {
		if errs := lc.errsAfter(mark[lc]); len(errs) > 0 {
			t.Errorf("consumer %s while another was cut off: %v", lc.name, errs)
		}
	}

	// The node killed and started again.
	survivors := []*ldConsumer{ref, bytesC, cut}
	for _, lc := range survivors {
		mark[lc] = len(lc.lines())
	}
	nodeKilled := node.Kill()
	meta, err := os.ReadFile(filepath.Join(c.shared, ldName, loader.MetaFile))
	if err != nil {
		t.Fatal(err)
	}
	var begun struct {
		Epoch int64 `json:"epoch"`
	}
	if err := json.Unmarshal(meta, &begun); err != nil || begun.Epoch < 0 {
		t.Fatalf("%s after the kill: %s (%v)", loader.MetaFile, meta, err)
	}
	lastBegun := begun.Epoch
	time.Sleep(time.Duration(200+c.rng.IntN(300)) * time.Millisecond)
	node = c.node(nodeHost, "", nodeArgs...)
	progress("after the node's restart", 2, survivors...)
	restartToEpochs := time.Since(nodeKilled)
	for _, lc := range survivors {
		// A consumer whose loop had yielded nothing of its epoch rides the
		// restart out without an error (loader.Consumer.Batches), so the
		// kill is not always marked in its lines: once a line is an error
		// or an epoch the killed producer cannot have begun, every epoch
		// completed after it must be one the restarted producer began.
		ls := lc.lines()[mark[lc]:]
		restarted := false
		for _, e := range ls {
			switch {
			case e.err != "":
				restarted = true
				if !strings.HasPrefix(e.err, "unavailable") && !strings.HasPrefix(e.err, "dropped") {
					t.Errorf("consumer %s after the node's kill: %q, want unavailable or dropped", lc.name, e.err)
				}
			case e.epoch > lastBegun:
				restarted = true
			case restarted:
				t.Errorf("consumer %s completed epoch %d after the restart; the killed producer had begun epoch %d", lc.name, e.epoch, lastBegun)
			}
		}
		if !restarted {
			t.Errorf("consumer %s completed no epoch after the restart", lc.name)
		}
		t.Logf("consumer %s after the node's kill: %v", lc.name, lc.errsAfter(mark[lc]))
	}
	if st, err := ldStats(ctx, stats); err != nil || st.Consumers != len(survivors) { // rpc dials the new node
		t.Errorf("the restarted producer: %+v, %v; want the %d survivors joined", st, err, len(survivors))
	}

	// Stop, and judge every epoch every consumer completed.
	for _, lc := range survivors {
		if err := lc.proc.Stop(30 * time.Second); err != nil {
			t.Errorf("consumer %s: %v", lc.name, err)
		}
	}
	if err := node.Stop(30 * time.Second); err != nil {
		t.Errorf("the node: %v", err)
	}
	hashes := map[int64]string{}
	epochs, torn, bad := 0, 0, 0
	for _, lc := range consumers {
		for _, e := range lc.lines() {
			if e.err != "" {
				continue
			}
			epochs++
			torn += e.torn
			if e.rows != ldSamples || e.dup != 0 || e.missing != 0 || e.torn != 0 {
				bad++
				t.Errorf("consumer %s, epoch %d: %d rows, %d duplicated, %d missing, %d torn; want each of %d samples once",
					lc.name, e.epoch, e.rows, e.dup, e.missing, e.torn, ldSamples)
			}
			if h, ok := hashes[e.epoch]; ok && h != e.hash {
				t.Errorf("consumer %s saw epoch %d in another order than another consumer", lc.name, e.epoch)
			}
			hashes[e.epoch] = e.hash
		}
	}
	figures(t, "consumers", len(consumers), "epochs_completed", epochs, "epochs_not_exactly_once", bad, "torn", torn,
		"kill_to_drop", killDrop.Round(time.Millisecond), "cut_to_drop", cutDrop.Round(time.Millisecond),
		"heal_to_2_epochs", healToEpoch.Round(time.Millisecond), "node_kill_to_2_epochs_each", restartToEpochs.Round(time.Millisecond),
		"last_epoch_begun_before_node_kill", lastBegun, "first_epochs_after_restart", firstAfterErr(survivors, mark))
}

// firstAfterErr returns, per consumer, the first epoch it completed after
// the first error after its lines mark.
func firstAfterErr(lcs []*ldConsumer, mark map[*ldConsumer]int) string {
	var out []string
	for _, lc := range lcs {
		sawErr := false
		for _, e := range lc.lines()[mark[lc]:] {
			if e.err != "" {
				sawErr = true
			} else if sawErr {
				out = append(out, fmt.Sprintf("%s:%d", lc.name, e.epoch))
				break
			}
		}
	}
	return strings.Join(out, ",")
}
