package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
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
	if !c.SharedFS() {
		t.Fatal("the client works by bytes; the node and the test share the root")
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
		{"b,sampler=stack", `sampler=stack: replay: bad config: sampler: selector: unknown kind "stack"; one of uniform, without_replacement, prioritized, fifo, lifo, max_heap, min_heap`},
		{"b,writer=top_k", "writer=top_k needs key=K"},
		{"b,key=reward", "give writer=top_k too"},
		{"b,writer=fifo", "want round_robin or top_k"},
		{"b,samples-per-insert=-2", "samples-per-insert=-2: want a finite number >= 0"},
		{"b,max-times-sampled=x", "max-times-sampled=x"},
		{"b,sampler=prioritized(alpha=1)", "the kind alone"},
		{"b,colour=red", `unknown setting "colour"; the settings are capacity, sampler, alpha, beta, eps, min-size, lease, samples-per-insert, error-buffer, max-times-sampled, writer, key and traj-key`},
		{"b,capacity", "not key=value"},
		{"b,lease=5", "lease"},
		{"b,capacity=0", "capacity=0: want at least 1"},
		{"b,capacity=-3", "capacity=-3: want at least 1"},
		{"b,min-size=0", "min-size=0: want at least 1"},
		{"b,lease=0s", "lease=0s: want a positive duration"},
		{"b,lease=-1s", "lease=-1s: want a positive duration"},
		{"b,capacity=8,min-size=9", "min-size=9 is larger than capacity=8"},
		{"b,min-size=9,capacity=8", "min-size=9 is larger than capacity=8"},
		{"b,sampler=uniform,alpha=0.5", "alpha=0.5: replay: bad config: sampler: selector: uniform takes no parameters (alpha given)"},
		{"b,beta=0.5,sampler=fifo", "fifo takes no parameters (beta given)"},
		{"b,sampler=prioritized,alpha=-1", "alpha=-1"},
		{"b,sampler=prioritized,beta=NaN", "beta=NaN"},
		{"b,capacity=4,capacity=8", "capacity given twice"},
		{"missing,lease=-1s", "lease"}, // a value check, before the buffer is looked for
	} {
		var f bufferFlags
		if err := f.Set(tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--buffer %q: %v, want an error about %q", tc.value, err, tc.want)
		}
	}
	var ok bufferFlags
	if err := ok.Set("b,capacity=8,lease=250ms"); err != nil {
		t.Fatalf("--buffer b,capacity=8,lease=250ms: %v", err)
	}
	if cfg, err := ok[0].createConfig(); err != nil || cfg.Lease != 250*time.Millisecond || cfg.Capacity != 8 {
		t.Fatalf("--buffer b,capacity=8,lease=250ms: %+v, %v", cfg, err)
	}
	var controls bufferFlags
	if err := controls.Set("c,capacity=8,sampler=lifo,samples-per-insert=2,error-buffer=64,max-times-sampled=3,writer=top_k,key=next/reward"); err != nil {
		t.Fatalf("--buffer with every table control: %v", err)
	}
	if cfg, err := controls[0].createConfig(); err != nil || cfg.Sampler.Kind() != "lifo" || cfg.Limit.SamplesPerInsert != 2 ||
		cfg.Limit.ErrorBuffer != 64 || cfg.MaxTimesSampled != 3 || cfg.Writer.String() != "top_k(key=next/reward)" {
		t.Fatalf("--buffer with every table control: %+v, %v", cfg, err)
	}
	// A buffer to open that does not exist, without a capacity to create it.
	var f bufferFlags
	if err := f.Set("missing"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.open(t.TempDir(), discardLog()); err == nil || !strings.Contains(err.Error(), "no capacity") {
		t.Fatalf("opening a missing buffer: %v", err)
	}
	// A negative --checkpoint-every is a usage error; before 2026-12-02
	// the node started and never checkpointed until it stopped.
	root := t.TempDir()
	// So is one under a second (since 2026-12-03): 1ns ran checkpoints
	// back to back.
	for _, every := range []string{"-1s", "1ns", "999ms"} {
		code, _, stderr := runNodeInProcess(t, "--listen", "127.0.0.1:0", "--root", root, "--buffer", "b,capacity=4", "--checkpoint-every", every)
		if left, _ := os.ReadDir(root); code != 2 || len(left) > 0 || !strings.Contains(stderr, "--checkpoint-every") {
			t.Fatalf("--checkpoint-every %s: exit %d, root holds %d entries, stderr %q; want exit 2 before the buffer is made", every, code, len(left), stderr)
		}
	}
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestNode_BufferNamedTwice: two --buffer flags for one folder are refused
// before anything is opened.
func TestNode_BufferNamedTwice(t *testing.T) {
	var f bufferFlags
	if err := f.Set("a/b,capacity=4"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("a//b/"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("the same buffer twice: %v", err)
	}
}

// TestNode_BufferRefusedCreateLeavesNothing: a setting no buffer can have
// (more memory than the machine has) is a clear error, not an out-of-memory
// crash, and leaves no folder behind.
func TestNode_BufferRefusedCreateLeavesNothing(t *testing.T) {
	for _, value := range []string{"v,capacity=10000000000000", "v,capacity=10000000000000,sampler=prioritized"} {
		root := t.TempDir()
		var f bufferFlags
		if err := f.Set(value); err != nil {
			t.Fatal(err)
		}
		_, _, err := f.open(root, discardLog())
		if !errors.Is(err, replay.ErrConfig) || !strings.Contains(err.Error(), "memory") || !strings.Contains(err.Error(), "buffer v") {
			t.Errorf("--buffer %s: %v; want a config error about memory, naming the buffer", value, err)
		}
		if left, _ := os.ReadDir(root); len(left) > 0 {
			t.Errorf("--buffer %s left %v in the root", value, left)
		}
	}
}

// openBuffers opens the --buffer values under root, as the node does, and
// returns what it logged; the buffers are closed before it returns.
func openBuffers(t *testing.T, root string, values ...string) (string, error) {
	t.Helper()
	var f bufferFlags
	for _, v := range values {
		if err := f.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	var logs strings.Builder
	sb, _, err := f.open(root, slog.New(slog.NewTextHandler(&logs, nil)))
	if err == nil {
		if cerr := sb.close(); cerr != nil {
			t.Fatal(cerr)
		}
	}
	return logs.String(), err
}

// replayJSON reads a buffer's replay.json.
func replayJSON(t *testing.T, prefix string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(prefix, replay.MetaFile))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestNode_BufferSettingsOfAnExistingBuffer: settings given for a buffer
// that exists are never ignored: those that cannot change (capacity, the
// sampler's kind) are refused naming both values, as are those that do
// not apply; those that can (lease, min-size, alpha and beta) are applied,
// logged and saved in replay.json.
func TestNode_BufferSettingsOfAnExistingBuffer(t *testing.T) {
	root := t.TempDir()
	if _, err := openBuffers(t, root, "u,capacity=16", "p,capacity=8,sampler=prioritized,alpha=0.7"); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(root, "u", replay.MetaFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"u,sampler=prioritized", []string{"sampler=prioritized", "uniform", "fixed"}},
		{"u,capacity=32", []string{"capacity=32", "16", "fixed"}},
		{"u,capacity=16,sampler=fifo", []string{"sampler=fifo", "uniform"}},
		{"u,alpha=0.5", []string{"alpha=0.5", "uniform takes no parameters", "the buffer's sampler is uniform"}},
		{"u,min-size=17", []string{"min-size=17", "16"}},
		{"p,sampler=uniform", []string{"sampler=uniform", "prioritized"}},
	} {
		_, err := openBuffers(t, root, tc.value)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("--buffer %s on the existing buffer: %v; want an error saying %q", tc.value, err, w)
			}
		}
		if after, _ := os.ReadFile(filepath.Join(root, "u", replay.MetaFile)); !bytes.Equal(before, after) {
			t.Fatalf("--buffer %s, refused, changed replay.json:\n%s", tc.value, after)
		}
	}

	logs, err := openBuffers(t, root, "u,capacity=16,sampler=uniform,lease=10s,min-size=4", "p,beta=0.9")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"lease=10s", "min-size=4", "beta=0.9"} {
		if !strings.Contains(logs, "buffer setting changed") || !strings.Contains(logs, w) {
			t.Errorf("the changes are not logged with %q:\n%s", w, logs)
		}
	}
	u, p := replayJSON(t, filepath.Join(root, "u")), replayJSON(t, filepath.Join(root, "p"))
	if u["lease_ms"] != 10000.0 || u["limit"].(map[string]any)["min_size"] != 4.0 {
		t.Errorf("u's replay.json after the changes: lease_ms %v, limit %v", u["lease_ms"], u["limit"])
	}
	if s := p["sampler"].(map[string]any); s["kind"] != "prioritized" || s["alpha"] != 0.7 || s["beta"] != 0.9 {
		t.Errorf("p's replay.json after the change: sampler %v; want prioritized, alpha 0.7 kept, beta 0.9", s)
	}
	// Giving what the buffer has already changes and logs nothing.
	logs, err = openBuffers(t, root, "u,lease=10s", "p,alpha=0.7,beta=0.9")
	if err != nil || strings.Contains(logs, "buffer setting changed") {
		t.Errorf("settings the buffers have: %v; logged:\n%s", err, logs)
	}
}

// TestNode_BufferFolderDeletedIsLogged: the node logs an error once when
// the folder of a buffer it serves is deleted, and the buffer refuses
// writes from then on.
func TestNode_BufferFolderDeletedIsLogged(t *testing.T) {
	root := t.TempDir()
	var f bufferFlags
	if err := f.Set("sig,capacity=8"); err != nil {
		t.Fatal(err)
	}
	logs := &proctest.LockedBuffer{}
	sb, _, err := f.open(root, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.close()
	if err := os.RemoveAll(filepath.Join(root, "sig")); err != nil {
		t.Fatal(err)
	}
	batch, _ := tensordict.New(1)
	reward, _ := tensordict.FromSlice([]float32{1}, 1)
	batch.Set("reward", reward)
	if _, err := sb.bufs[0].Extend(context.Background(), batch); !errors.Is(err, replay.ErrStorageLost) {
		t.Errorf("Extend into the deleted buffer: %v; want ErrStorageLost", err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), "level=ERROR"); {
		if time.Now().After(deadline) {
			t.Fatalf("no error logged within 30 s of the folder's deletion:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "buffer storage lost") || !strings.Contains(logs.String(), "name=sig") {
		t.Errorf("the log does not say which buffer was lost:\n%s", logs)
	}
}

// TestBufferSpec_SamplerParams: any parameter of the sampler is a
// setting, eps among them; one the sampler does not take is refused when
// the buffer is created.
func TestBufferSpec_SamplerParams(t *testing.T) {
	var f bufferFlags
	if err := f.Set("b,capacity=8,sampler=prioritized,eps=0.01,alpha=0.7"); err != nil {
		t.Fatal(err)
	}
	cfg, err := f[0].createConfig()
	want, _ := replay.ParseSampler("prioritized(alpha=0.7, eps=0.01)")
	if err != nil || cfg.Sampler != want {
		t.Errorf("createConfig: sampler %v, %v; want %v", cfg.Sampler, err, want)
	}
	if err := f.Set("c,capacity=8,alpha=0.7"); err != nil {
		t.Fatal(err) // the buffer may exist, with a prioritized sampler
	}
	if _, err := f[1].createConfig(); err == nil || !strings.Contains(err.Error(), "uniform takes no parameters (alpha given)") {
		t.Errorf("creating a uniform buffer with alpha=: %v", err)
	}
	help := samplerHelp()
	for _, k := range append(replay.SamplerKinds(), "alpha=A, beta=B, eps=E (prioritized)") {
		if !strings.Contains(help, k) {
			t.Errorf("samplerHelp() = %q; it does not name %s", help, k)
		}
	}
}
