package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
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

// TestNode_TwoNodesOneBuffer: a second "tensorwire node --buffer" on the
// root and buffer a running node serves does not start: it exits with
// status 1 and says which process holds the buffer. The first node goes
// on serving it.
func TestNode_TwoNodesOneBuffer(t *testing.T) {
	root := t.TempDir()
	first := startNode(t, "--root", root, "--buffer", "sig,capacity=16")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliBinary(t), "node", "--listen", "127.0.0.1:0", "--root", root, "--buffer", "sig,capacity=16")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the second node: %v; want exit status 1\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	host, _ := os.Hostname()
	want := fmt.Sprintf("buffer in use by pid %d (tensorwire) on %s", first.proc.Pid(), host)
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("the second node's stderr does not say %q:\n%s", want, &stderr)
	}
	if strings.Contains(stdout.String(), "listening on") {
		t.Errorf("the second node listened:\n%s", &stdout)
	}
	c, err := replay.Dial(ctx, first.addr, "sig", replay.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	batch, _ := tensordict.New(2)
	reward, _ := tensordict.FromSlice([]float32{1, 2}, 2)
	batch.Set("reward", reward)
	if _, err := c.Extend(ctx, batch); err != nil {
		t.Fatalf("the first node after the second was refused: %v", err)
	}
	first.stop(t)
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
