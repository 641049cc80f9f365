package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
)

// TestWatchParentChange: watchExit's fallback where no pidfd can be had
// (before Linux 5.3, and on other systems) calls exited once this
// process's parent exits and it is given another; it refuses a pid that is
// not its parent. Three processes: the test, a "parent" it kills with
// SIGKILL, and that parent's child, which watches it.
func TestWatchParentChange(t *testing.T) {
	dir := os.Getenv("TW_WATCH_DIR")
	switch os.Getenv("TW_WATCH_ROLE") {
	case "parent":
		c := exec.Command(os.Args[0], "-test.run=^TestWatchParentChange$")
		c.Env = append(os.Environ(), "TW_WATCH_ROLE=child")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute) // until killed
		return
	case "child":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		exited := make(chan struct{})
		if err := watchParentChange(ctx, os.Getppid(), func() { close(exited) }, nil); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "watching"), nil, 0o644)
		select {
		case <-exited:
			os.WriteFile(filepath.Join(dir, "exited"), nil, 0o644)
		case <-ctx.Done():
		}
		return
	}
	if err := watchParentChange(context.Background(), os.Getpid(), func() {}, nil); err == nil {
		t.Error("watching a pid that is not the parent: no error")
	}
	dir = t.TempDir()
	parent := exec.Command(os.Args[0], "-test.run=^TestWatchParentChange$")
	parent.Env = append(os.Environ(), "TW_WATCH_ROLE=parent", "TW_WATCH_DIR="+dir)
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer parent.Process.Kill()
	exists := func(name string) func() bool {
		return func() bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
	}
	svctest.Poll(t, 30*time.Second, "the child watching its parent", exists("watching"))
	parent.Process.Kill()
	parent.Wait()
	svctest.Poll(t, 10*time.Second, "the child seeing its parent exit", exists("exited"))
}
