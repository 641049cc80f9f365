package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestNode_ServesStore: "tensorwire node --store" serves a store that a
// client dials, and a node started again on the same root has everything
// the first acknowledged.
func TestNode_ServesStore(t *testing.T) {
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := startNode(t, "--root", root, "--store", "st,inline=1KiB,lease=5s")
	c, err := store.Dial(ctx, n.addr, "st", store.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	if !c.SharedFS() {
		t.Fatal("SharedFS false, want true: the node and the test share the root")
	}
	x, _ := tensordict.FromSlice(make([]float32, 1000))
	td, _ := tensordict.New()
	td.Set("w", x)
	if _, err := c.Append(ctx, "rollouts", td); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Publish(ctx, "params", td); err != nil || v != 1 {
		t.Fatalf("Publish = %d, %v", v, err)
	}
	c.Close()
	n.stop(t)

	n = startNode(t, "--root", root, "--store", "st")
	c, err = store.Dial(ctx, n.addr, "st", store.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	counts, rev, err := c.List(ctx)
	if err != nil || counts["rollouts"] != 1 || rev != 2 {
		t.Fatalf("after the restart: %v at revision %d, %v", counts, rev, err)
	}
	p, err := c.Latest(ctx, "params")
	if err != nil || p.Version != 1 {
		t.Fatalf("Latest after the restart: %+v, %v", p, err)
	}
	p.Close()
}

// TestNode_TwoNodesOneStore: a second node for a store another node serves
// exits with status 1 and names the process holding it.
func TestNode_TwoNodesOneStore(t *testing.T) {
	root := t.TempDir()
	first := startNode(t, "--root", root, "--store", "st")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliBinary(t), "node", "--listen", "127.0.0.1:0", "--root", root, "--store", "st")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the second node: %v; want exit status 1\nstderr:\n%s", err, &stderr)
	}
	host, _ := os.Hostname()
	if want := fmt.Sprintf("held by pid %d (tensorwire) on %s", first.proc.Pid(), host); !strings.Contains(stderr.String(), want) {
		t.Errorf("the second node's stderr does not say %q:\n%s", want, &stderr)
	}
	first.stop(t)
}

func TestNode_StoreFlagErrors(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"", "empty"},
		{"a/b", "'/'"},
		{"..", "not a name"},
		{"s,max-value=x", "max-value"},
		{"s,max-value=0", "max-value"},
		{"s,inline=-1", "inline"},
		{"s,sync=sometimes", "sync"},
		{"s,lease=0s", "lease"},
		{"s,get-timeout=x", "get-timeout"},
		{"s,history=0", "history"},
		{"s,repair=yes", "repair"},
		{"s,trash-grace=-1s", "trash-grace"},
		{"s,colour=red", "unknown setting"},
		{"s,max-value", "not key=value"},
		{"s,lease=1s,lease=2s", "lease given twice"},
	} {
		var f storeFlags
		if err := f.Set(tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--store %q: %v, want an error about %q", tc.value, err, tc.want)
		}
	}
	var f storeFlags
	if err := f.Set("s,max-value=64MiB,inline=512KiB,sync=none,lease=3s,get-timeout=1m,history=10,trash-grace=2m,repair=drop"); err != nil {
		t.Fatal(err)
	}
	want := store.Options{MaxValueBytes: 64 << 20, InlineBytes: 512 << 10, NoSync: true, LeaseTTL: 3 * time.Second,
		GetTimeout: time.Minute, History: 10, Repair: true, TrashGrace: 2 * time.Minute}
	if f[0].opts != want {
		t.Fatalf("options %+v, want %+v", f[0].opts, want)
	}
	if err := f.Set("s"); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("a store given twice: %v", err)
	}
	// A setting Open refuses is an error before the node listens.
	var big storeFlags
	big.Set("s,inline=100MiB")
	if _, _, err := big.open(t.TempDir(), discardLog()); !errors.Is(err, store.ErrConfig) {
		t.Fatalf("inline=100MiB: %v, want ErrConfig", err)
	}
}

// TestNode_StoreRefusesOtherFolder: "--store NAME" on a folder of other
// files exits with status 1, saying it is not a store, and deletes none of
// them.
func TestNode_StoreRefusesOtherFolder(t *testing.T) {
	root := t.TempDir()
	files := []string{"st/notes.txt", "st/trash/a.txt", "st/values/00000000000000ab/x", "st/staging/n-0000000000000001/x"}
	for _, f := range files {
		p := filepath.Join(root, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("mine"), 0o644)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliBinary(t), "node", "--listen", "127.0.0.1:0", "--root", root, "--store", "st")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "it is not a store") {
		t.Fatalf("node on a folder of other files: %v; want exit status 1 saying it is not a store\nstderr:\n%s", err, &stderr)
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
