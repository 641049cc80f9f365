package replay

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestCoordinator_Barrier runs a run of two writers and a trainer through
// the barrier in-process: nobody passes a phase before everyone has
// reached it, indices are distinct, intruders are refused, and a caller
// that gives up no longer counts.
func TestCoordinator_Barrier(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newCoordinator(2, 100, time.Second)

	// A writer that gives up at the start does not count, and frees its index.
	gctx, giveUp := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := c.barrier(gctx, barrierRequest{Phase: phaseStart, Role: roleWriter, Mode: modeRef})
		gone <- err
	}()
	waitArrived(t, c, phaseStart, 1)
	giveUp()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("a writer that gave up: %v", err)
	}
	waitArrived(t, c, phaseStart, 0)

	type joined struct {
		role string
		resp barrierResponse
		err  error
	}
	out := make(chan joined, 3)
	join := func(role string) {
		resp, err := c.barrier(ctx, barrierRequest{Phase: phaseStart, Role: role, Mode: modeRef})
		out <- joined{role, resp, err}
	}
	go join(roleWriter)
	go join(roleTrainer)
	waitArrived(t, c, phaseStart, 2)
	select {
	case j := <-out:
		t.Fatalf("a %s passed the start with a participant missing: %+v", j.role, j)
	default:
	}
	if _, err := c.barrier(ctx, barrierRequest{Phase: "lunch"}); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Errorf("an unknown phase: %v", err)
	}
	// A writer in another mode (its root is the node's files through
	// another page cache) joins too.
	go func() {
		resp, err := c.barrier(ctx, barrierRequest{Phase: phaseStart, Role: roleWriter, Mode: modeBytes})
		out <- joined{roleWriter, resp, err}
	}()
	var indices []int
	for range 3 {
		j := <-out
		if j.err != nil {
			t.Fatal(j.err)
		}
		if j.resp.Writers != 2 || j.resp.Capacity != 100 || j.resp.DurationNS != int64(time.Second) {
			t.Errorf("%s got the run %+v", j.role, j.resp)
		}
		if j.role == roleWriter {
			indices = append(indices, j.resp.Index)
		}
	}
	slices.Sort(indices)
	if !slices.Equal(indices, []int{0, 1}) {
		t.Errorf("writer indices %v", indices)
	}
	if _, err := c.barrier(ctx, barrierRequest{Phase: phaseStart, Role: roleTrainer, Mode: modeRef}); rpc.CodeOf(err) != rpc.FailedPrecondition {
		t.Errorf("a second trainer: %v", err)
	}
	if mode, phase, _ := c.state(); mode != modeMixed || phase != phaseStart {
		t.Errorf("state %s, %s", mode, phase)
	}

	done := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := c.barrier(ctx, barrierRequest{Phase: phaseDone})
			done <- err
		}()
	}
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-c.finished:
	default:
		t.Error("finished is not closed after phase done")
	}
}

// waitArrived waits until n participants wait at phase.
func waitArrived(t *testing.T, c *coordinator, phase string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if c.arrived(phase) == n {
			return
		}
	}
	t.Fatalf("%d participants never waited at %s", n, phase)
}

func TestResultTap(t *testing.T) {
	var out bytes.Buffer
	tap := newResultTap(&out)
	for _, chunk := range []string{"log 1\nlo", "g 2\n{\"role\":\"wri", "ter\",\"index\":3}\n", "log 3\n", `{"role":"again"}` + "\n"} {
		if n, err := tap.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	var w writerResult
	if err := tap.decode(0, "the writer", &w); err != nil || w.Role != roleWriter || w.Index != 3 {
		t.Errorf("decode = %+v, %v", w, err)
	}
	if want := "log 1\nlog 2\nlog 3\n{\"role\":\"again\"}\n"; out.String() != want {
		t.Errorf("passed through %q, want %q", out.String(), want)
	}
	if err := newResultTap(&out).decode(time.Millisecond, "nobody", &w); err == nil || !strings.Contains(err.Error(), "nobody printed no result") {
		t.Errorf("decode without a result: %v", err)
	}
}
