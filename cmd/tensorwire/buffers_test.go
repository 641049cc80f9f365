package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestNode_ServesReplayBuffer runs "tensorwire node --buffer", extends
// and samples through replay.Dial, stops the node with SIGTERM, and finds
// the transitions again in a node started on the same root.
func TestNode_ServesReplayBuffer(t *testing.T) {
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := startNode(t, "--root", root, "--buffer", "actors/buf,capacity=16,sampler=prioritized,alpha=0.7")
	c, err := replay.Dial(ctx, n.addr, "actors/buf", replay.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode() != "ref" {
		t.Fatalf("mode %s, want ref: the node and the test share the root", c.Mode())
	}
	reward, err := tensordict.FromSlice([]float32{1, 2, 3}, 3)
	if err != nil {
		t.Fatal(err)
	}
	batch, _ := tensordict.New(3)
	batch.Set("reward", reward)
	if _, err := c.Extend(ctx, batch); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.Size != 3 || !strings.HasPrefix(st.Sampler, "prioritized(alpha=0.7") {
		t.Fatalf("stats %+v, %v", st, err)
	}
	c.Close()
	n.stop(t)

	n = startNode(t, "--root", root, "--buffer", "actors/buf")
	c, err = replay.Dial(ctx, n.addr, "actors/buf", replay.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	td, _, err := c.Sample(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := td.Tensor("reward")
	vals, _ := tensordict.Values[float32](got)
	seen := map[float32]bool{}
	for _, v := range vals {
		seen[v] = true
	}
	if len(seen) != 3 || !seen[1] || !seen[2] || !seen[3] {
		t.Fatalf("after the restart the buffer gave %v, want 1, 2 and 3", seen)
	}
}

func TestNode_BufferFlagErrors(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"", "a folder under the root"},
		{"../up,capacity=4", "a folder under the root"},
		{"b,capacity=x", "capacity"},
		{"b,sampler=lifo", "unknown sampler"},
		{"b,colour=red", "unknown setting"},
		{"b,capacity", "not key=value"},
		{"b,lease=5", "lease"},
	} {
		var f bufferFlags
		if err := f.Set(tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--buffer %q: %v, want an error about %q", tc.value, err, tc.want)
		}
	}
	var ok bufferFlags
	if err := ok.Set("b,capacity=8,lease=250ms"); err != nil || ok[0].cfg.Lease != 250*time.Millisecond || ok[0].cfg.Capacity != 8 {
		t.Fatalf("--buffer b,capacity=8,lease=250ms: %+v, %v", ok, err)
	}
	// A buffer to open that does not exist, without a capacity to create it.
	var f bufferFlags
	if err := f.Set("missing"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.open(t.TempDir(), discardLog()); err == nil || !strings.Contains(err.Error(), "no capacity") {
		t.Fatalf("opening a missing buffer: %v", err)
	}
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }
