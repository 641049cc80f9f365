//go:build linux

package collective

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

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
