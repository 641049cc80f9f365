package faulttest

import (
	"fmt"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"strings"
	"testing"
	"time"
)

// failedCall is a call a helper reported as failed ("fail START END KIND").
type failedCall struct {
	who        string
	start, end time.Time
	kind       string
}

func failedCalls(p *proctest.Proc) []failedCall {
	var out []failedCall
	for _, line := range strings.Split(p.Output(), "\n") {
		var s, e int64
		var kind string
		if n, _ := fmt.Sscanf(line, "fail %d %d %s", &s, &e, &kind); n == 3 {
			out = append(out, failedCall{p.Name(), time.UnixMicro(s), time.UnixMicro(e), kind})
		}
	}
	return out
}

// The buffer node's host is cut off the network (its link down: packets
// dropped, nothing closed) while writers and a trainer work with a 2 s
// deadline on every call, then the link comes back. Calls fail with
// Unavailable within their deadline, never later; once the network heals,
// the same processes carry on, and nothing acknowledged is lost.
func TestPartitionHeals(t *testing.T) {
	const callTimeout = 2 * time.Second
	const slack = 250 * time.Millisecond // scheduling on a loaded 2-core machine
	c := newCluster(t)
	w := startWorkload(t, c, callTimeout)
	clients := []*proctest.Proc{w.writers[0].proc, w.writers[1].proc, w.trainer}
	type window struct{ from, to time.Time }
	var cuts []window
	var resumed []time.Duration
	for range load.Partitions {
		for _, p := range clients {
			waitStat(t, p, 30*time.Second, "progress before the partition", func(s map[string]string) bool { return statInt(s, "ok") > 10 })
		}
		time.Sleep(load.Run / time.Duration(2*load.Partitions))
		from := time.Now()
		if err := w.nodeHost.Disconnect(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(load.Partition)
		before := make([]int, len(clients))
		for i, p := range clients {
			before[i] = statInt(stat(p), "ok")
		}
		if err := w.nodeHost.Reconnect(); err != nil {
			t.Fatal(err)
		}
		to := time.Now()
		cuts = append(cuts, window{from, to})
		for i, p := range clients {
			waitStat(t, p, 30*time.Second, "progress after the heal", func(s map[string]string) bool { return statInt(s, "ok") > before[i]+1 })
		}
		resumed = append(resumed, time.Since(to).Round(time.Millisecond))
	}
	time.Sleep(load.Run / time.Duration(2*load.Partitions))

	var failed, unavailable, inFlight int
	for _, p := range clients {
		if !p.Alive() {
			t.Fatalf("%s died", p.Name())
		}
		for _, f := range failedCalls(p) {
			failed++
			took := f.end.Sub(f.start)
			if took > callTimeout+slack {
				t.Errorf("%s: a call failed (%s) after %v, past its %v deadline", f.who, f.kind, took, callTimeout)
			}
			var cut *window
			for i := range cuts {
				if f.end.After(cuts[i].from) && f.start.Before(cuts[i].to.Add(slack)) {
					cut = &cuts[i]
				}
			}
			switch {
			case cut == nil:
				t.Errorf("%s: a call failed (%s) at %v, outside every partition", f.who, f.kind, f.end.Format(time.StampMicro))
			case f.kind == "unavailable":
				unavailable++
			case f.start.Before(cut.from):
				inFlight++ // in flight when the link went down: slow or gone, it cannot tell yet
			default:
				t.Errorf("%s: a call started during the partition failed with %s, want unavailable", f.who, f.kind)
			}
		}
	}
	if unavailable == 0 {
		t.Errorf("no call failed with Unavailable during %d partitions of %v", load.Partitions, load.Partition)
	}
	v, ts := w.finish(t)
	figures(t, "load", load.Name, "partitions", load.Partitions, "partition", load.Partition, "call_deadline", callTimeout,
		"failed_calls", failed, "unavailable", unavailable, "deadline_in_flight_at_cut", inFlight,
		"heal_to_progress", fmt.Sprint(resumed), "acked", v.Acked, "lost", v.Lost, "duplicated", v.Duplicated,
		"in_flight_whole", v.InFlight, "sampled", ts["rows"], "torn", ts["torn"])
}
