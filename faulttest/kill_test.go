package faulttest

import (
	"fmt"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/netns"
)

// workload is a buffer node, two writers and a trainer, each on its own
// host: writer 0 and the trainer share the node's root (by reference),
// writer 1 has none (bytes).
type workload struct {
	c        *cluster
	nodeHost *netns.Host
	node     *proctest.Proc
	nodeArgs []string
	writers  []*writerRun
	trainer  *proctest.Proc
}

type writerRun struct {
	n    int
	host *netns.Host
	ref  bool
	log  string
	inc  int // the current incarnation
	proc *proctest.Proc
}

const leaseInTests = 2 * time.Second

func startWorkload(t *testing.T, c *cluster, callTimeout time.Duration) *workload {
	hosts := []*netns.Host{c.host("buffer"), c.host("writer0"), c.host("writer1"), c.host("trainer")}
	w := &workload{c: c, nodeHost: hosts[0], nodeArgs: bufferArgs(load.capacity(2), leaseInTests)}
	w.node = c.node(w.nodeHost, "", w.nodeArgs...)
	for i := range 2 {
		wr := &writerRun{n: i, host: hosts[1+i], ref: i == 0, log: filepath.Join(t.TempDir(), fmt.Sprintf("writer%d.log", i))}
		w.writers = append(w.writers, wr)
		w.startWriter(t, wr, callTimeout)
	}
	args := []string{"-addr", addr(w.nodeHost), "-token-file", c.token, "-root", c.shared, "-batch", "64"}
	if callTimeout > 0 {
		args = append(args, "-call-timeout", callTimeout.String())
	}
	w.trainer = c.helper(hosts[3], "trainer", "trainer", args...)
	for _, wr := range w.writers {
		wr.proc.Expect(t, "ready")
	}
	if mode := w.trainer.Expect(t, "ready"); mode != "ref" {
		t.Fatalf("the trainer shares the root but runs in %s mode", mode)
	}
	return w
}

func (w *workload) startWriter(t *testing.T, wr *writerRun, callTimeout time.Duration) {
	args := []string{"-addr", addr(w.nodeHost), "-token-file", w.c.token, "-writer", itoa(wr.n), "-inc", itoa(wr.inc),
		"-log", wr.log, "-pace", load.WriterPace.String()}
	if wr.ref {
		args = append(args, "-root", w.c.shared)
	}
	if callTimeout > 0 {
		args = append(args, "-call-timeout", callTimeout.String())
	}
	wr.proc = w.c.helper(wr.host, "writer", fmt.Sprintf("writer %d.%d", wr.n, wr.inc), args...)
}

// finish stops the writers and the trainer, checks the trainer's samples,
// stops the node cleanly and judges what the buffer holds against the
// writers' logs.
func (w *workload) finish(t *testing.T) (verdict, map[string]string) {
	t.Helper()
	var logs []string
	for _, wr := range w.writers {
		if err := wr.proc.Stop(30 * time.Second); err != nil {
			t.Errorf("writer %d: %v", wr.n, err)
		}
		logs = append(logs, wr.log)
	}
	if err := w.trainer.Stop(30 * time.Second); err != nil {
		t.Errorf("trainer: %v", err)
	}
	ts := stat(w.trainer)
	if statInt(ts, "torn") != 0 || statInt(ts, "rows") == 0 {
		t.Errorf("trainer: %v, want rows sampled and none torn", ts)
	}
	if err := w.node.Stop(30 * time.Second); err != nil {
		t.Errorf("buffer node: %v", err)
	}
	l, err := readBatchLogs(logs...)
	if err != nil {
		t.Fatal(err)
	}
	held, err := heldIDs(filepath.Join(w.c.shared, "rb"))
	if err != nil {
		t.Fatal(err)
	}
	v := judge(l, held)
	if !v.ok() {
		t.Errorf("the buffer does not hold exactly what was acknowledged: %+v", v)
	}
	return v, ts
}

// Writers are killed with SIGKILL at random moments (dialing, reserving,
// halfway through writing rows, committing) and restarted, while the
// trainer samples. At the end the buffer holds every acknowledged
// transition once, whole batches of those in flight at a kill, and
// nothing else; no sample was torn.
func TestWritersKilledAndRestarted(t *testing.T) {
	c := newCluster(t)
	w := startWorkload(t, c, 0)
	end := time.Now().Add(load.Run)
	kills := 0
	for time.Now().Before(end) {
		wr := w.writers[c.rng.IntN(len(w.writers))]
		d := load.KillEvery[0] + time.Duration(c.rng.Int64N(int64(load.KillEvery[1]-load.KillEvery[0])))
		time.Sleep(d)
		wr.proc.Kill()
		kills++
		wr.inc++
		w.startWriter(t, wr, 0)
	}
	for _, wr := range w.writers { // the last incarnations get going
		wr.proc.Expect(t, "ready")
	}
	time.Sleep(300 * time.Millisecond)
	v, ts := w.finish(t)
	figures(t, "load", load.Name, "run", load.Run, "writer_kills", kills, "acked", v.Acked, "held", v.Held,
		"lost", v.Lost, "duplicated", v.Duplicated, "partial", v.Partial, "in_flight_whole", v.InFlight,
		"sampled", ts["rows"], "torn", ts["torn"])
	if kills < 3 {
		t.Errorf("only %d kills in %v", kills, load.Run)
	}
}

// The buffer node is killed with SIGKILL under load and restarted from its
// prefix on the same address. The writers and the trainer, never
// restarted, carry on by themselves; nothing acknowledged is lost.
func TestBufferNodeKilledAndRestarted(t *testing.T) {
	c := newCluster(t)
	w := startWorkload(t, c, 0)
	gap := load.Run / time.Duration(load.NodeKills+1)
	var down []time.Duration
	for range load.NodeKills {
		time.Sleep(gap)
		before := []map[string]string{stat(w.writers[0].proc), stat(w.writers[1].proc), stat(w.trainer)}
		w.node.Kill()
		killed := time.Now()
		time.Sleep(time.Duration(100+c.rng.IntN(400)) * time.Millisecond)
		w.node = c.node(w.nodeHost, "", w.nodeArgs...)
		// Everyone makes progress again, without being restarted.
		for i, p := range []*proctest.Proc{w.writers[0].proc, w.writers[1].proc, w.trainer} {
			key := "ok"
			waitStat(t, p, 30*time.Second, "progress after the restart", func(s map[string]string) bool {
				return statInt(s, key) > statInt(before[i], key)+1
			})
		}
		down = append(down, time.Since(killed).Round(time.Millisecond))
	}
	time.Sleep(gap)
	for _, p := range []*proctest.Proc{w.writers[0].proc, w.writers[1].proc, w.trainer} {
		if s := stat(p); statInt(s, "other") != 0 {
			t.Errorf("%s saw errors other than Unavailable: %v", p.Name(), s)
		}
	}
	v, ts := w.finish(t)
	figures(t, "load", load.Name, "run", load.Run, "node_kills", load.NodeKills, "kill_to_progress", fmt.Sprint(down),
		"acked", v.Acked, "held", v.Held, "lost", v.Lost, "duplicated", v.Duplicated, "partial", v.Partial,
		"in_flight_whole", v.InFlight, "sampled", ts["rows"], "torn", ts["torn"])
}
