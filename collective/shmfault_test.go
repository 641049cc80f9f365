//go:build linux

package collective

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestShm_TruncatedDataIsAnError: a rank's data files truncated under the
// mappings (by hand: no rank does it) fail the next collective that
// touches them on every rank, with an error wrapping memmap.ErrFault on a
// rank that faulted, and kill no process: the transport runs under
// memmap's fault guard. The communicator is broken afterwards.
func TestShm_TruncatedDataIsAnError(t *testing.T) {
	comms := group(t, 2, SHM)
	big := func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
		x, _ := tensordict.Zeros(memmap.Float32, 1<<18) // 1 MiB: past smallShm
		return c.Allreduce(ctx, x, Sum)
	}
	all(t, comms, big)
	all(t, comms, big) // both file sets mapped, by both ranks
	files, _ := filepath.Glob(filepath.Join(comms[1].shm.dir, "rank-1.d*"))
	if len(files) != 2 {
		t.Fatalf("rank 1's data files: %v", files)
	}
	for _, f := range files {
		if err := os.Truncate(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	_, errs := onAll(t, comms, big)
	faulted := false
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error", r)
		}
		faulted = faulted || errors.Is(err, memmap.ErrFault)
	}
	if !faulted {
		t.Errorf("no rank says it faulted: %v", errs)
	}
	if _, errs := onAll(t, comms, big); errs[0] == nil || errs[1] == nil {
		t.Errorf("after the fault: %v, want the communicator broken", errs)
	}
}

// TestHier_TruncatedDataIsAnError: the same for a host's files in a
// hierarchical communicator: every rank's Allreduce fails (those that
// faulted with memmap.ErrFault, the others with ErrAborted naming the
// rank), none waits for its deadline (the other host's ranks, which wait
// for messages, hear of it through their watches), no process dies, and
// the communicator is broken.
func TestHier_TruncatedDataIsAnError(t *testing.T) {
	comms := hierGroup(t, []int{0, 0, 1, 1}, Hier)
	big := func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
		x, _ := tensordict.Zeros(memmap.Float32, 1<<20) // 4 MiB: every rank its share
		return c.Allreduce(ctx, x, Sum)
	}
	all(t, comms, big)
	all(t, comms, big)
	files, _ := filepath.Glob(filepath.Join(comms[1].hier.g.dir, "rank-1.d*"))
	if len(files) != 2 {
		t.Fatalf("rank 1's data files: %v", files)
	}
	for _, f := range files {
		if err := os.Truncate(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	_, errs := onAll(t, comms, big)
	for r, err := range errs {
		t.Logf("rank %d: %v", r, err)
	}
	faulted := false
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error", r)
		}
		faulted = faulted || errors.Is(err, memmap.ErrFault)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("rank %d waited for its deadline: %v", r, err)
		}
	}
	if !faulted {
		t.Errorf("no rank says it faulted: %v", errs)
	}
	if _, errs := onAll(t, comms, big); errs[0] == nil || errs[3] == nil {
		t.Errorf("after the fault: %v, want the communicator broken", errs)
	}
}

// TestShm_AbandonReportsTheCause: a rank that sees another give up a
// collective through the mappings (its abort word) reports why that rank
// gave up (the communicator's own news: here a rank lost) even when the
// news comes a good while after the abort word, as it does under load
// (the race detector on two busy cores), not "rank 1 abandoned
// collective N", which names the rank that gave up but not the cause. CI
// saw the second (TestHier_MovesFullFolderIsNoSpace and
// TestNetns_HierRankKilled) when the news took more than the 50 ms the
// rank used to wait for it.
func TestShm_AbandonReportsTheCause(t *testing.T) {
	comms := group(t, 2, SHM)
	g0, g1 := comms[0].shm, comms[1].shm
	p := g1.word(g1.me, ctlPhase).Load() + 1
	g1.abort() // rank 1 gives up phase p; rank 0 has no word of why yet
	cause := errorf(ErrPeerLost, "rank 1 lost rank 7 (the cause)")
	time.AfterFunc(300*time.Millisecond, func() { comms[0].fail(cause) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := g0.waitRank(ctx, 1, p)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "the cause") {
		t.Fatalf("waiting for rank 1's phase: %v, want the cause (ErrPeerLost)", err)
	}
}
