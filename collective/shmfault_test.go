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
