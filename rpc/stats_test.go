package rpc

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"
)

func TestServer_Stats(t *testing.T) {
	n := startTestNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitStats := func(what string, ok func(Stats) bool) Stats {
		t.Helper()
		for {
			st := n.s.Stats()
			if ok(st) {
				return st
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: stats %+v", what, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitStats("no peers yet", func(s Stats) bool { return s.Peers == 0 && s.Handshakes == 0 })

	// A connection that never says hello is a handshake in progress.
	raw, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	waitStats("a silent connection", func(s Stats) bool { return s.Handshakes == 1 && s.Peers == 0 })

	c := dial(t, n.addr)
	got, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Peers != 1 || got.Streams != 1 || got.Handshakes != 1 || got.Goroutines <= 0 || got.HeapBytes == 0 || got.OpenFiles <= 0 {
		t.Fatalf("remote stats with one peer in a call and one handshaking: %+v", got)
	}

	raw.Close()
	c.Close()
	waitStats("everyone gone", func(s Stats) bool { return s.Peers == 0 && s.Handshakes == 0 && s.Streams == 0 })
}

// TestHeapInUse_IsMemStatsHeapInuse: heapInUse reads through
// runtime/metrics what MemStats.HeapInuse counts. Read one after the
// other, they agree to within the few spans another goroutine may take
// in between (1 MiB allowed).
func TestHeapInUse_IsMemStatsHeapInuse(t *testing.T) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	got := heapInUse()
	diff := int64(got) - int64(ms.HeapInuse)
	t.Logf("heapInUse %d, HeapInuse %d", got, ms.HeapInuse)
	if got == 0 || diff < -1<<20 || diff > 1<<20 {
		t.Errorf("heapInUse() = %d; MemStats.HeapInuse = %d", got, ms.HeapInuse)
	}
}
