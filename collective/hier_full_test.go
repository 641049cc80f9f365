//go:build linux

package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// hierSmallFolder forms a 2x2 hierarchy (ranks 0, 1 on host 0; 2, 3 on
// host 1) whose host 0 has a 12 MiB tmpfs as its shared folder.
func hierSmallFolder(t *testing.T) []*Comm {
	t.Helper()
	dirs := []string{mountShm(t, 12<<20), t.TempDir()}
	addr := freeAddr(t)
	comms := make([]*Comm, 4)
	errs := make([]error, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			comms[r], errs[r] = Join(ctx, Config{Rank: r, Size: 4, Addr: addr, Transport: Hier, ShmDir: dirs[r/2]})
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	return comms
}

// TestHier_MovesFullFolderIsNoSpace: a hierarchy's Bcast, Allgather,
// Reduce, ReduceScatter, Gather, Scatter or Alltoall whose data does not
// fit in a host's shared folder fails on every rank,
// on both hosts, with ErrNoSpace (the room reserved before the
// descriptions go out), and the communicator goes on with tensors that
// fit; a Bcast whose carrier on the full host passed no tensor (its room
// known only after the check) breaks it instead: the carrier fails with
// the folder's error, the ranks that needed it with ErrAborted naming it
// (the other host's host-mate, which needs nothing of it, may complete),
// at once, and the next call fails on every rank; so does a Scatter
// whose pieces for the full host do not fit in its leader's file (known
// only after the check: the leader passed no tensor).
func TestHier_MovesFullFolderIsNoSpace(t *testing.T) {
	comms := hierSmallFolder(t)
	// A host's files keep the size they grew to (rank 1's first data file
	// 4 MiB after the Allgather): 16 MiB never fits.
	big := func() *tensordict.Tensor { x, _ := tensordict.Zeros(memmap.Float32, 4<<20); return x } // 16 MiB
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, c *Comm) error
	}{
		// Rank 0, host 0's leader, stages every rank's 4 MiB: 16 MiB.
		{"Allgather", func(ctx context.Context, c *Comm) error {
			x, _ := tensordict.Zeros(memmap.Float32, 1<<20)
			_, err := c.Allgather(ctx, x, 0)
			return err
		}},
		// Rank 0 carries rank 2's 16 MiB to host 0.
		{"BcastInto", func(ctx context.Context, c *Comm) error { return c.BcastInto(ctx, big(), 2) }},
		// Rank 1, the root, publishes its 16 MiB for rank 0.
		{"Bcast from host 0", func(ctx context.Context, c *Comm) error {
			_, err := c.Bcast(ctx, big(), 1)
			return err
		}},
		// Every rank publishes its 16 MiB input, host 0's ranks too.
		{"Reduce", func(ctx context.Context, c *Comm) error { return c.ReduceInto(ctx, big(), big(), Sum, 3) }},
		{"ReduceScatter", func(ctx context.Context, c *Comm) error {
			_, err := c.ReduceScatter(ctx, big(), Max, 0, nil)
			return err
		}},
		// Rank 1 publishes its 16 MiB for rank 0, the root.
		{"Gather to host 0", func(ctx context.Context, c *Comm) error {
			_, err := c.Gather(ctx, big(), 0, 0)
			return err
		}},
		// Rank 0, host 0's leader, stages its host's 32 MiB for rank 2.
		{"GatherInto host 1", func(ctx context.Context, c *Comm) error {
			var y *tensordict.Tensor
			if c.Rank() == 2 {
				y, _ = tensordict.Zeros(memmap.Float32, 16<<20)
			}
			return c.GatherInto(ctx, y, big(), 0, 2)
		}},
		// Rank 1, the root, publishes rank 0's 16 MiB piece of 64 MiB.
		{"Scatter from host 0", func(ctx context.Context, c *Comm) error {
			var x *tensordict.Tensor
			if c.Rank() == 1 {
				x, _ = tensordict.Zeros(memmap.Float32, 16<<20)
			}
			_, err := c.Scatter(ctx, x, 0, nil, 1)
			return err
		}},
		// Every rank publishes its 16 MiB input.
		{"Alltoall", func(ctx context.Context, c *Comm) error {
			x, _ := tensordict.Zeros(memmap.Float32, 4, 1<<20)
			_, err := c.Alltoall(ctx, x, 1, 0, nil)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) { return 0, tc.fn(ctx, c) })
			for r, err := range errs {
				if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) || err.Error() != errs[0].Error() {
					t.Fatalf("rank %d: %v; rank 0: %v; want the same ErrNoSpace", r, err, errs[0])
				}
			}
			t.Logf("%v", errs[0])
			// Tensors that fit, through both file sets.
			for i := range 2 {
				got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
					x, _ := tensordict.FromSlice([]float64{float64(c.Rank())})
					y, err := c.Allgather(ctx, x, 0)
					if err != nil {
						return nil, err
					}
					return c.Bcast(ctx, y, i)
				})
				for r, g := range got {
					if v, _ := tensordict.Values[float64](g); fmt.Sprint(v) != "[0 1 2 3]" {
						t.Fatalf("rank %d, then: %v, want [0 1 2 3]", r, v)
					}
				}
			}
		})
	}
	t.Run("Scatter to the full host", func(t *testing.T) {
		// Host 0's leader receives its host's 32 MiB of rank 2's
		// tensor: known only after the check, so the failure breaks the
		// communicator, as a Bcast carrier's without a tensor, on a
		// communicator of its own.
		comms := hierSmallFolder(t)
		start := time.Now()
		_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
			var x *tensordict.Tensor
			if c.Rank() == 2 {
				x, _ = tensordict.Zeros(memmap.Float32, 16<<20)
			}
			_, err := c.Scatter(ctx, x, 0, nil, 2)
			return 0, err
		})
		for r, err := range errs {
			if r >= 2 && err == nil {
				continue // the other host needs nothing of rank 0
			}
			want := ErrAborted
			if r == 0 {
				want = syscall.ENOSPC
			}
			if !errors.Is(err, want) || r != 0 && !strings.Contains(err.Error(), "rank 0 broke off") {
				t.Fatalf("rank %d: %v, want %v (naming rank 0)", r, err, want)
			}
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Fatalf("the ranks took %v to fail", d)
		}
		t.Logf("rank 0: %v; rank 1: %v; rank 2: %v", errs[0], errs[1], errs[2])
		brokenAfter(t, comms, errs)
	})
	t.Run("Bcast, the carrier without a tensor", func(t *testing.T) {
		start := time.Now()
		_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
			x := big()
			if c.Rank() == 0 {
				x = nil
			}
			_, err := c.Bcast(ctx, x, 2)
			return 0, err
		})
		for r, err := range errs {
			want := ErrAborted
			if r == 0 {
				want = syscall.ENOSPC
			}
			if r == 3 && err == nil {
				continue
			}
			if !errors.Is(err, want) || r != 0 && !strings.Contains(err.Error(), "rank 0 broke off") {
				t.Fatalf("rank %d: %v, want %v (naming rank 0)", r, err, want)
			}
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Fatalf("the ranks took %v to fail", d)
		}
		t.Logf("rank 0: %v; rank 2: %v", errs[0], errs[2])
		brokenAfter(t, comms, errs)
	})
}

// brokenAfter checks the calls after a collective that rank 0 broke off
// (errs: each rank's result of it). A rank whose part needed nothing of
// rank 0 returned nil, and hears of the break from its watch of rank 0,
// which may come while its next call runs: that call then fails with the
// cause, as any rank's first failing call does (ErrAborted naming rank 0),
// not ErrBroken (CI saw it once, under load). Every other rank's next
// call, and every rank's call after, is ErrBroken.
func brokenAfter(t *testing.T, comms []*Comm, errs []error) {
	t.Helper()
	_, next := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) { return 0, c.Barrier(ctx) })
	for r, err := range next {
		first := errs[r] == nil && errors.Is(err, ErrAborted) && strings.Contains(err.Error(), "rank 0 broke off")
		if !errors.Is(err, ErrBroken) && !first {
			t.Fatalf("rank %d, the next call: %v, want ErrBroken", r, err)
		}
	}
	_, after := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) { return 0, c.Barrier(ctx) })
	for r, err := range after {
		if !errors.Is(err, ErrBroken) {
			t.Fatalf("rank %d, the call after: %v, want ErrBroken", r, err)
		}
	}
}
