package store

// Tests with nodes, workers, trainers, readers and watchers in other
// processes, killed with SIGKILL. The other process is this test binary
// run again (proctest); TENSORWIRE_STORE_HELPER says what it is.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

const (
	envHelper = "TENSORWIRE_STORE_HELPER" // what the helper is
	envAddr   = "TENSORWIRE_STORE_ADDR"   // node: where to listen; others: the node
	envRoot   = "TENSORWIRE_STORE_ROOT"   // the shared root
	envMode   = "TENSORWIRE_STORE_MODE"   // ref or bytes
	envFirst  = "TENSORWIRE_STORE_FIRST"  // appender: its first item id
)

// helperOptions are the node's: short times so expiries happen within a
// test, small inline values so large items go by reference.
var helperOptions = Options{GetTimeout: 300 * time.Millisecond, LeaseTTL: 300 * time.Millisecond, InlineBytes: 4096}

// TestHelperProcess is not a test: it is the body of the helper processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	proctest.RunHelper(t, envHelper, map[string]func() error{
		"node":     helperNode,
		"appender": func() error { return helperAppender(t) },
		"extender": func() error { return helperExtender(t) },
		"taker":    helperTaker,
		"reader":   helperReader,
		"watcher":  helperWatcher,
	})
}

// helperNode serves the store $ROOT/st on $ADDR (any port if unset),
// prints "ADDR host:port" and serves until killed.
func helperNode() error {
	root := os.Getenv(envRoot)
	s, err := Open(filepath.Join(root, "st"), helperOptions)
	if err != nil {
		return err
	}
	return svctest.ServeHelper(root, os.Getenv(envAddr), Register, "st", s)
}

func helperDial() (*Client, error) {
	opts := []DialOption{WithRoot(os.Getenv(envRoot))}
	if os.Getenv(envMode) == "bytes" {
		opts = append(opts, WithBytes())
	}
	return Dial(context.Background(), os.Getenv(envAddr), "st", opts...)
}

// helperAppender appends items $FIRST, $FIRST+1, ... to bin b, large and
// small in turn, printing "ACK id" once each is acknowledged, until killed.
func helperAppender(t *testing.T) error {
	c, err := helperDial()
	if err != nil {
		return err
	}
	first, _ := strconv.Atoi(os.Getenv(envFirst))
	for id := first; ; id++ {
		if _, err := c.Append(context.Background(), "b", itemTD(t, int64(id), sizeOf(id))); err != nil {
			return err
		}
		fmt.Println("ACK", id)
	}
}

// helperExtender extends bin b by items $FIRST, $FIRST+1, ... three at a
// time (every third large: staged in ref mode), flat out, printing "ACK
// id" for each item of every Extend acknowledged.
func helperExtender(t *testing.T) error {
	c, err := helperDial()
	if err != nil {
		return err
	}
	first, _ := strconv.Atoi(os.Getenv(envFirst))
	for id := first; ; id += 3 {
		tds := []*tensordict.TensorDict{itemTD(t, int64(id), sizeOf(id)), itemTD(t, int64(id+1), sizeOf(id+1)), itemTD(t, int64(id+2), sizeOf(id+2))}
		if _, err := c.Extend(context.Background(), "b", tds); err != nil {
			return err
		}
		fmt.Printf("ACK %d\nACK %d\nACK %d\n", id, id+1, id+2)
	}
}

// sizeOf is item id's number of int64s: every third is large (by
// reference in ref mode).
func sizeOf(id int) int {
	if id%3 == 0 {
		return 2048
	}
	return 16
}

// helperTaker does a Get's first phase on bin b, prints "TOOK n" and waits
// to be killed before acknowledging it: a trainer dying mid-Get.
func helperTaker() error {
	c, err := helperDial()
	if err != nil {
		return err
	}
	resp, err := rpc.Call[takeResponse](context.Background(), c.rc, MethodTake,
		takeRequest{Store: "st", Bin: "b", Take: random64(), Refs: c.ref})
	if err != nil {
		return err
	}
	fmt.Println("TOOK", len(resp.Items))
	select {}
}

// helperReader reads the latest version of parameters p, prints "HOLD v"
// and holds it (renewing its lease) until killed.
func helperReader() error {
	c, err := helperDial()
	if err != nil {
		return err
	}
	p, err := c.Latest(context.Background(), "p")
	if err != nil {
		return err
	}
	fmt.Println("HOLD", p.Version)
	select {}
}

// helperWatcher watches everything from revision 0 and prints "EV rev"
// for each event, until killed.
func helperWatcher() error {
	c, err := helperDial()
	if err != nil {
		return err
	}
	fmt.Println("WATCHING")
	for e, err := range c.Watch(context.Background(), "", 0) {
		if err != nil {
			return err
		}
		fmt.Println("EV", e.Revision)
	}
	return nil
}

// startNode starts a node helper (on addr if not "") and returns it and
// its address.
func startNode(t *testing.T, root, addr string) (*proctest.Proc, string) {
	t.Helper()
	env := []string{envHelper + "=node", envRoot + "=" + root}
	if addr != "" {
		env = append(env, envAddr+"="+addr)
	}
	return proctest.StartServer(t, env...)
}

// drained collects what Gets returned and fails the test on a duplicate.
type drained struct {
	mu   sync.Mutex
	seen map[int64]int
	dups []int64
}

func (d *drained) add(ids []int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[int64]int{}
	}
	for _, id := range ids {
		d.seen[id]++
		if d.seen[id] > 1 {
			d.dups = append(d.dups, id)
		}
	}
}

// check fails t unless every acknowledged id was drained exactly once and
// none twice.
func (d *drained) check(t *testing.T, acked []int64) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.dups) > 0 {
		t.Errorf("items drained twice: %v", d.dups[:min(len(d.dups), 10)])
	}
	var lost []int64
	for _, id := range acked {
		if d.seen[id] != 1 {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d acknowledged items not drained: %v", len(lost), lost[:min(len(lost), 10)])
	}
}

// drainAll Gets bin b until it is empty.
func drainAll(t *testing.T, ctx context.Context, c *Client, d *drained) {
	t.Helper()
	for {
		tds, err := c.Get(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		if len(tds) == 0 {
			return
		}
		d.add(ids(t, tds))
	}
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	svctest.Poll(t, 30*time.Second, what, cond)
}

// TestProcess_NodeKilledAndRestarted kills the node with SIGKILL while
// four writers append (large items by reference in ref mode), a trainer
// drains and a watcher watches, and starts it again on the same address:
// they carry on by themselves; every append acknowledged is drained
// exactly once and nothing twice; the watcher sees every revision once, in
// order, without a gap.
func TestProcess_NodeKilledAndRestarted(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			node, addr := startNode(t, root, "")
			w := dialT(t, addr, "st", root, mode)
			tr := dialT(t, addr, "st", root, mode)
			wa := dialT(t, addr, "st", root, mode)
			ctx := ctxT(t)

			var stop atomic.Bool
			var mu sync.Mutex
			var acked []int64
			var nacked atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := range 4 {
				wg.Go(func() {
					for id := g * 1_000_000; !stop.Load(); id++ {
						if _, err := w.Append(ctx, "b", itemTD(t, int64(id), sizeOf(id))); err != nil {
							errs <- fmt.Errorf("append %d: %w", id, err)
							return
						}
						mu.Lock()
						acked = append(acked, int64(id))
						mu.Unlock()
						nacked.Add(1)
					}
				})
			}
			var d drained
			var gets atomic.Int64
			wg.Go(func() {
				for !stop.Load() {
					tds, err := tr.Get(ctx, "b")
					if err != nil {
						errs <- fmt.Errorf("get: %w", err)
						return
					}
					d.add(ids(t, tds))
					gets.Add(1)
				}
			})
			var revs []uint64
			var watchErr error
			wctx, wcancel := context.WithCancel(ctx)
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				for e, err := range wa.Watch(wctx, "", 0) {
					if err != nil {
						watchErr = err
						return
					}
					mu.Lock()
					revs = append(revs, e.Revision)
					mu.Unlock()
				}
			}()
			progressed := func(what string, acked, gotten int64) {
				t.Helper()
				waitFor(t, what, func() bool {
					if len(errs) > 0 {
						return true
					}
					return nacked.Load() > acked+200 && gets.Load() > gotten+10
				})
			}
			progressed("before the kill", 0, 0)
			node.Kill()
			ackedAtKill, getsAtKill := nacked.Load(), gets.Load()
			startNode(t, root, addr)
			progressed("after the restart", ackedAtKill, getsAtKill)
			stop.Store(true)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			drainAll(t, ctx, tr, &d)
			d.check(t, acked)
			// Nothing is left staged: what the dead node was writing (by
			// bytes, the large items' prefixes as their bytes arrived) was
			// swept when it was started again, and every call since ended.
			if ents, err := os.ReadDir(filepath.Join(root, "st", stagingDir)); err != nil || len(ents) != 0 {
				t.Fatalf("staging/ after the calls: %v, %v", ents, err)
			}
			// The watcher has seen every event up to the last one.
			st, err := tr.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the watcher catching up", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return watchErr != nil || len(revs) > 0 && revs[len(revs)-1] >= st.Revision
			})
			wcancel()
			<-watched
			if watchErr != nil && !errors.Is(watchErr, context.Canceled) {
				t.Fatalf("the watch: %v", watchErr)
			}
			for i, r := range revs {
				if r != uint64(i+1) {
					t.Fatalf("the watcher's %dth event has revision %d: an event was missed or repeated", i+1, r)
				}
			}
			t.Logf("%s: %d appends acknowledged (%d at the kill), %d Gets, %d events watched", mode, len(acked), ackedAtKill, gets.Load(), len(revs))
		})
	}
}

// TestProcess_WriterKilledMidAppend kills a writer process appending flat
// out (staging prefixes in ref mode) while another writer and the trainer
// go on: every append the dead writer had acknowledged is drained exactly
// once, and the others are not held up.
func TestProcess_WriterKilledMidAppend(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			c, acked := killedWriter(t, mode, "appender", 1000000, 30)
			ctx := ctxT(t)
			var d drained
			// This process's appends and Gets carry on.
			for id := range 50 {
				if _, err := c.Append(ctx, "b", itemTD(t, int64(id), sizeOf(id))); err != nil {
					t.Fatal(err)
				}
				acked = append(acked, int64(id))
			}
			drainAll(t, ctx, c, &d)
			d.check(t, acked)
			t.Logf("%s: %d appends acknowledged by the killed writer", mode, len(acked)-50)
		})
	}
}

// killedWriter serves a store, starts the writer helper role (appender,
// extender) writing items first, first+1, ... in mode, kills it with
// SIGKILL once it has acknowledged more than acks items, and returns a
// client of the store in mode and the ids the writer printed as
// acknowledged.
func killedWriter(t *testing.T, mode, role string, first, acks int) (*Client, []int64) {
	t.Helper()
	root := t.TempDir()
	_, addr := startNode(t, root, "")
	c := dialT(t, addr, "st", root, mode)
	wp := proctest.Start(t, envHelper+"="+role, envAddr+"="+addr, envRoot+"="+root, envMode+"="+mode, envFirst+"="+strconv.Itoa(first))
	waitFor(t, "the writer's first acknowledgements", func() bool { return strings.Count(wp.Output(), "ACK") > acks })
	wp.Kill()
	var acked []int64
	for _, line := range strings.Split(wp.Output(), "\n") {
		if id, ok := strings.CutPrefix(line, "ACK "); ok {
			n, _ := strconv.Atoi(id)
			acked = append(acked, int64(n))
		}
	}
	return c, acked
}

// TestProcess_WriterKilledMidExtend kills a writer process extending the
// bin three items at a time: every item of its acknowledged Extends is
// drained exactly once, and of the Extend it was killed in, all three
// items or none.
func TestProcess_WriterKilledMidExtend(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			const first = 1000000
			c, acked := killedWriter(t, mode, "extender", first, 60)
			var d drained
			drainAll(t, ctxT(t), c, &d)
			d.check(t, acked)
			groups := map[int64]int{}
			for id := range d.seen {
				groups[(id-first)/3]++
			}
			for g, n := range groups {
				if n != 3 {
					t.Errorf("%d of the 3 items of the Extend of %d..%d drained", n, first+3*g, first+3*g+2)
				}
			}
			t.Logf("%s: %d items acknowledged by the killed writer, %d drained", mode, len(acked), len(d.seen))
		})
	}
}

// TestProcess_TrainerKilledMidGet kills a trainer between a Get's two
// phases: it had the items but never acknowledged them. Another trainer's
// Get gets every one of them, once, when the dead one's hold expires.
func TestProcess_TrainerKilledMidGet(t *testing.T) {
	root := t.TempDir()
	_, addr := startNode(t, root, "")
	c := dialT(t, addr, "st", root, "ref")
	ctx := ctxT(t)
	var acked []int64
	for id := range 20 {
		if _, err := c.Append(ctx, "b", itemTD(t, int64(id), sizeOf(id))); err != nil {
			t.Fatal(err)
		}
		acked = append(acked, int64(id))
	}
	tp := proctest.Start(t, envHelper+"=taker", envAddr+"="+addr, envRoot+"="+root, envMode+"=ref")
	if n := tp.Expect(t, "TOOK"); n != "20" {
		t.Fatalf("the taker took %s items", n)
	}
	tp.Kill()
	// Meanwhile the items are held: a Get returns none of them.
	if _, err := c.Append(ctx, "b", itemTD(t, 100, 1)); err != nil {
		t.Fatal(err)
	}
	first, err := c.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	var d drained
	d.add(ids(t, first))
	waitFor(t, "the dead trainer's items coming back", func() bool {
		st, err := c.Stats(ctx)
		return err == nil && st.Gets == 0
	})
	drainAll(t, ctx, c, &d)
	d.check(t, append(acked, 100))
}

// TestProcess_ReaderKilledLeaseExpires kills a reader holding a lease on
// a parameter version: once its lease runs out, the node deletes the
// version (a newer one being published).
func TestProcess_ReaderKilledLeaseExpires(t *testing.T) {
	root := t.TempDir()
	_, addr := startNode(t, root, "")
	c := dialT(t, addr, "st", root, "ref")
	ctx := ctxT(t)
	if _, err := c.Publish(ctx, "p", itemTD(t, 1, 1000)); err != nil {
		t.Fatal(err)
	}
	rp := proctest.Start(t, envHelper+"=reader", envAddr+"="+addr, envRoot+"="+root, envMode+"=ref")
	if v := rp.Expect(t, "HOLD"); v != "1" {
		t.Fatalf("the reader holds version %s", v)
	}
	if _, err := c.Publish(ctx, "p", itemTD(t, 2, 1000)); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stats(ctx); err != nil || st.Versions != 2 || st.Leases != 1 {
		t.Fatalf("stats %+v, %v while the reader holds v1; want 2 versions, 1 lease", st, err)
	}
	rp.Kill()
	waitFor(t, "v1 deleted after its reader died", func() bool {
		st, err := c.Stats(ctx)
		return err == nil && st.Versions == 1 && st.Leases == 0
	})
	// The files go once the record that dropped v1 is durable, after the
	// in-memory count: poll for them too.
	waitFor(t, "v1's files removed", func() bool {
		vals, _ := os.ReadDir(filepath.Join(root, "st", valuesDir))
		return len(vals) == 1
	})
}

// TestProcess_WatcherKilledResumes kills a watcher process; the store does
// not notice, and a new watcher started from the dead one's last revision
// sees exactly the events after it.
func TestProcess_WatcherKilledResumes(t *testing.T) {
	root := t.TempDir()
	_, addr := startNode(t, root, "")
	c := dialT(t, addr, "st", root, "bytes")
	ctx := ctxT(t)
	wp := proctest.Start(t, envHelper+"=watcher", envAddr+"="+addr, envRoot+"="+root, envMode+"=bytes")
	wp.Expect(t, "WATCHING")
	for id := range 10 {
		if _, err := c.Append(ctx, "b", itemTD(t, int64(id), 1)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the watcher's events", func() bool { return wp.Last("EV ") == "10" })
	wp.Kill()
	for id := range 5 {
		if _, err := c.Append(ctx, "b", itemTD(t, int64(id), 1)); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	for e, err := range c.Watch(ctx, "", 10) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Revision)
		if len(got) == 5 {
			break
		}
	}
	if !slices.Equal(got, []uint64{11, 12, 13, 14, 15}) {
		t.Fatalf("resumed watch = %v", got)
	}
}
