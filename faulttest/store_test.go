package faulttest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The store across hosts (docs/store.md, docs/reliability.md): a store node
// ("tensorwire node --store st"), two writers appending flat out (one by
// reference through the shared root, one by bytes), a trainer draining
// with Get and publishing parameters that the writers read, and a watcher
// watching everything from revision 0, each on its own host. Writer 0 is
// killed with SIGKILL and started again, the trainer's host is cut off
// and reconnected, and the node is killed with SIGKILL and started again.
// At the end every append a writer saw acknowledged was drained exactly
// once, nothing twice, and the watcher saw every revision once, in order.

func init() {
	roles["store-writer"] = runStoreWriter
	roles["store-trainer"] = runStoreTrainer
	roles["store-watcher"] = runStoreWatcher
}

type storeFlags struct {
	addr, root, tokenFile string
	first                 int
}

func (f *storeFlags) parse(name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&f.addr, "addr", "", "the store node")
	fs.StringVar(&f.root, "root", "", "the shared root; empty: bytes")
	fs.StringVar(&f.tokenFile, "token-file", "", "the shared secret")
	fs.IntVar(&f.first, "first", 0, "writer: its first item id")
	return fs.Parse(args)
}

// dial connects to the store "st", trying again until ctx ends.
func (f *storeFlags) dial(ctx context.Context) (*store.Client, error) {
	token, err := nodeproc.ReadToken(f.tokenFile)
	if err != nil {
		return nil, err
	}
	opts := []store.DialOption{store.WithRPC(rpc.WithToken(token))}
	if f.root != "" {
		opts = append(opts, store.WithRoot(f.root))
	}
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := store.Dial(dctx, f.addr, "st", opts...)
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

// storeItem is item id: its id in every element; every fifth is 2 MiB
// (by reference from a writer sharing the root).
func storeItem(id int) *tensordict.TensorDict {
	n := 64
	if id%5 == 0 {
		n = 256 << 10
	}
	xs := make([]int64, n)
	for i := range xs {
		xs[i] = int64(id)
	}
	x, _ := tensordict.FromSlice(xs)
	td, _ := tensordict.New()
	td.Set("id", x)
	return td
}

// storeItemID returns an item's id, or an error if its elements disagree.
func storeItemID(td *tensordict.TensorDict) (int, error) {
	x, err := td.Tensor("id")
	if err != nil {
		return 0, err
	}
	xs, err := tensordict.Values[int64](x)
	if err != nil {
		return 0, err
	}
	for _, v := range xs {
		if v != xs[0] {
			return 0, fmt.Errorf("a torn item: %d and %d", xs[0], v)
		}
	}
	return int(xs[0]), nil
}

// runStoreWriter appends items -first, -first+1, ... to bin "b" until
// its context ends, printing "ack ID" after each acknowledged one, and
// reads the latest parameters every 20 items ("param V").
func runStoreWriter(ctx context.Context, args []string) error {
	var f storeFlags
	if err := f.parse("store-writer", args); err != nil {
		return err
	}
	c, err := f.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("ready", storeMode(c))
	for id := f.first; ctx.Err() == nil; id++ {
		if _, err := c.Append(ctx, "b", storeItem(id)); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		fmt.Println("ack", id)
		if id%20 == 0 {
			if p, err := c.Latest(ctx, "p"); err == nil {
				fmt.Println("param", p.Version)
				p.Close()
			} else if !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
				return err
			}
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// runStoreTrainer drains bin "b" with Get, printing "got ID" for each
// item, and publishes 1 MiB parameters every 200 ms, until its context
// ends; then it drains the bin until it is empty and prints "drained".
func runStoreTrainer(ctx context.Context, args []string) error {
	var f storeFlags
	if err := f.parse("store-trainer", args); err != nil {
		return err
	}
	c, err := f.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("ready", storeMode(c))
	get := func(ctx context.Context) (int, error) {
		tds, err := c.Get(ctx, "b")
		if err != nil {
			return 0, err
		}
		for _, td := range tds {
			id, err := storeItemID(td)
			td.Close()
			if err != nil {
				return 0, err
			}
			fmt.Println("got", id)
		}
		return len(tds), nil
	}
	last := time.Now()
	for ctx.Err() == nil {
		if _, err := get(ctx); err != nil && ctx.Err() == nil {
			describeValues(f.root, err)
			return err
		}
		if time.Since(last) > 200*time.Millisecond {
			last = time.Now()
			if _, err := c.Publish(ctx, "p", storeItem(5)); err != nil && ctx.Err() == nil {
				return err
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Drain: Get until the bin is empty. An empty Get is not an empty bin
	// when another Get holds items (one whose give-back, best effort,
	// did not reach the node): they come back after the node's
	// get-timeout, so an empty Get is followed by a List, and the drain
	// goes on, printing "held N", while the bin still has items.
	dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		n, err := get(dctx)
		if err != nil {
			describeValues(f.root, err)
			return err
		}
		if n > 0 {
			continue
		}
		bins, _, err := c.List(dctx)
		if err != nil {
			return err
		}
		if bins["b"] == 0 {
			fmt.Println("drained")
			return nil
		}
		fmt.Println("held", bins["b"])
		time.Sleep(100 * time.Millisecond)
	}
}

// describeValues prints to stderr, for a failed run's reader, what the
// store's folder holds of the value err names (a path under values/):
// its files, and any trash/ entry of the same id.
func describeValues(root string, err error) {
	m := regexp.MustCompile(`values/([0-9a-f]{16})`).FindStringSubmatch(err.Error())
	if root == "" || m == nil {
		return
	}
	dir := filepath.Join(root, "st")
	ents, lerr := os.ReadDir(filepath.Join(dir, "values", m[1]))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	fmt.Fprintf(os.Stderr, "values/%s now: %v (%v)\n", m[1], names, lerr)
	for _, sub := range []string{"trash", "staging"} {
		ents, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), m[1]) || strings.HasPrefix(e.Name(), "n-"+m[1]) {
				fmt.Fprintf(os.Stderr, "%s/%s is there\n", sub, e.Name())
			}
		}
	}
}

// runStoreWatcher watches everything from revision 0, printing "ev REV"
// for each event, until its context ends.
func runStoreWatcher(ctx context.Context, args []string) error {
	var f storeFlags
	if err := f.parse("store-watcher", args); err != nil {
		return err
	}
	c, err := f.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("ready", storeMode(c))
	for e, err := range c.Watch(ctx, "", 0) {
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		fmt.Println("ev", e.Revision)
	}
	return nil
}

// linesAfter returns the numbers on p's output lines that start with
// prefix.
func linesAfter(out, prefix string) []int {
	var ns []int
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
				ns = append(ns, n)
			}
		}
	}
	return ns
}

func TestStoreAcrossHosts(t *testing.T) {
	c := newCluster(t)
	nodeHost, w0Host, w1Host, trHost, waHost := c.host("store"), c.host("writer0"), c.host("writer1"), c.host("trainer"), c.host("watcher")
	nodeArgs := []string{"--store", "st,get-timeout=2s,lease=2s"}
	node := c.node(nodeHost, "", nodeArgs...)
	common := []string{"-addr", addr(nodeHost), "-token-file", c.token}
	writer := func(n, first int) *proctest.Proc {
		root := c.shared
		if n == 1 {
			root = "" // bytes
		}
		h := w0Host
		if n == 1 {
			h = w1Host
		}
		p := c.helper(h, "store-writer", fmt.Sprintf("store writer %d from %d", n, first),
			append(common, "-root", root, "-first", itoa(first))...)
		mode := p.Expect(t, "ready")
		if want := map[int]string{0: "ref", 1: "bytes"}[n]; mode != want {
			t.Fatalf("writer %d runs in %s mode, want %s", n, mode, want)
		}
		return p
	}
	w0 := writer(0, 0)
	w1 := writer(1, 10_000_000)
	trainer := c.helper(trHost, "store-trainer", "store trainer", append(common, "-root", c.shared)...)
	if mode := trainer.Expect(t, "ready"); mode != "ref" {
		t.Fatalf("the trainer runs in %s mode, want ref", mode)
	}
	watcher := c.helper(waHost, "store-watcher", "store watcher", common...)
	watcher.Expect(t, "ready")

	progress := func(what string, from map[string]int) map[string]int {
		t.Helper()
		now := map[string]int{}
		deadline := time.Now().Add(60 * time.Second)
		for {
			now["w0"] = len(linesAfter(w0.Output(), "ack "))
			now["w1"] = len(linesAfter(w1.Output(), "ack "))
			now["got"] = len(linesAfter(trainer.Output(), "got "))
			if now["w0"] > from["w0"]+50 && now["w1"] > from["w1"]+50 && now["got"] > from["got"]+50 {
				return now
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no progress in 60 s: %v (from %v)", what, now, from)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	at := progress("at the start", nil)

	// A writer dies mid-append: its acknowledged appends must be there.
	w0.Kill()
	var acked []int
	acked = append(acked, linesAfter(w0.Output(), "ack ")...)
	w0 = writer(0, 1_000_000)
	at = progress("after writer 0 was killed", at)

	// The trainer is cut off for 3 s: its Get's items wait for it (or come
	// back after the hold), nobody else stalls.
	trHost.Disconnect()
	time.Sleep(3 * time.Second)
	trHost.Reconnect()
	at = progress("after the trainer's partition", at)

	// The node dies and comes back on the same address.
	node.Kill()
	node = c.node(nodeHost, "", nodeArgs...)
	progress("after the node was killed and restarted", at)

	// Stop: writers first, then the trainer drains what is left.
	for _, w := range []*proctest.Proc{w0, w1} {
		if err := w.Stop(30 * time.Second); err != nil {
			t.Fatalf("stopping a writer: %v", err)
		}
	}
	acked = append(acked, linesAfter(w0.Output(), "ack ")...)
	acked = append(acked, linesAfter(w1.Output(), "ack ")...)
	if err := trainer.Stop(90 * time.Second); err != nil {
		t.Fatalf("stopping the trainer: %v", err)
	}
	if trainer.Last("drained") == "" && !strings.Contains(trainer.Output(), "drained") {
		t.Fatal("the trainer did not drain the bin to the end")
	}
	got := map[int]int{}
	for _, id := range linesAfter(trainer.Output(), "got ") {
		got[id]++
	}
	lost, dups := 0, 0
	var lostIDs []int
	for _, id := range acked {
		if got[id] == 0 {
			lost++
			lostIDs = append(lostIDs, id)
		}
	}
	for _, n := range got {
		if n > 1 {
			dups++
		}
	}
	if lost > 0 || dups > 0 {
		t.Errorf("%d acknowledged appends lost, %d items drained twice", lost, dups)
		defer whereLost(t, filepath.Join(c.shared, "st"), lostIDs) // once the node has stopped
	}
	// The watcher saw every revision once, in order.
	time.Sleep(500 * time.Millisecond)
	watcher.Stop(30 * time.Second)
	revs := linesAfter(watcher.Output(), "ev ")
	for i, r := range revs {
		if r != i+1 {
			t.Fatalf("the watcher's event %d has revision %d: one was missed or repeated", i+1, r)
		}
	}
	params := len(linesAfter(w1.Output(), "param ")) + len(linesAfter(w0.Output(), "param "))
	held := linesAfter(trainer.Output(), "held ")
	if len(held) > 0 {
		// Not a failure (the items came back, as the node promises), but
		// a give-back that did not reach the node: worth a look.
		t.Logf("the drain found %d items held by another Get after an empty Get, and waited for them", held[0])
	}
	figures(t, "acked", len(acked), "drained", len(got), "lost", lost, "duplicated", dups, "events_watched", len(revs),
		"param_reads", params, "drain_held_waits", len(held))
	node.Stop(30 * time.Second)
}

// whereLost tells a failed run's reader where the acknowledged items the
// trainer never drained are: still in the bin (the drain stopped early)
// or not (the store lost them). It opens the store's folder itself, so
// the node must have stopped.
func whereLost(t *testing.T, dir string, lost []int) {
	s, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Logf("whereLost: %v", err)
		return
	}
	defer s.Close()
	tds, err := s.Peek(context.Background(), "b")
	if err != nil {
		t.Logf("whereLost: peek: %v", err)
		return
	}
	in := map[int]bool{}
	for _, td := range tds {
		if id, err := storeItemID(td); err == nil {
			in[id] = true
		}
		td.Close()
	}
	still := 0
	for _, id := range lost {
		if in[id] {
			still++
		}
	}
	t.Logf("of the %d acknowledged items never drained, %d are still in the bin (%d items there in all); the first: %v",
		len(lost), still, len(tds), lost[:min(len(lost), 10)])
}

// storeMode names c's mode as the scenario's lines do: "ref" or "bytes".
func storeMode(c *store.Client) string {
	if c.SharedFS() {
		return "ref"
	}
	return "bytes"
}
