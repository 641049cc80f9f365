package nodeproc

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSpawn_ClosedStdoutHonoursContext: a child that closes (or
// redirects) its stdout without printing its address, and keeps running,
// must not hold Spawn past its context: Spawn used to wait for the child to
// exit, ignoring ctx and startTimeout.
func TestSpawn_ClosedStdoutHonoursContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Spawn(ctx, Child{Name: "sh", Path: "/bin/sh", Args: []string{"-c", "exec >/dev/null; exec sleep 20"}})
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Spawn took %v with a context of 300ms", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Spawn: %v, want context.DeadlineExceeded", err)
	}
}
