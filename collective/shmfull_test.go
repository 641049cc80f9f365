//go:build linux

package collective

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// mountShm mounts a tmpfs of size bytes on a new folder, to serve as a
// small, fillable Config.ShmDir, and unmounts it when the test ends (after
// the cleanups registered later, which close the communicators on it). It
// skips the test when it cannot mount (not root).
func mountShm(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs as the shared folder")
	}
	dir := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a %d-byte tmpfs on %s: %v: %s", size, dir, err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			exec.Command("umount", "-l", dir).Run()
			t.Errorf("unmounting %s: %v: %s (unmounted lazily)", dir, err, bytes.TrimSpace(out))
		}
	})
	return dir
}

// fillShm writes a file in dir until the filesystem is full.
func fillShm(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4096, 1} {
		buf := bytes.Repeat([]byte{0xAB}, size)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// joinIn forms a communicator of n ranks in this process with ShmDir dir
// and returns each rank's Comm or Join error; the Comms close when the
// test ends.
func joinIn(t *testing.T, n int, tr Transport, dir string) ([]*Comm, []error) {
	t.Helper()
	addr := freeAddr(t)
	comms := make([]*Comm, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			comms[r], errs[r] = Join(ctx, Config{Rank: r, Size: n, Addr: addr, Transport: tr, ShmDir: dir})
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
	return comms, errs
}

// TestShm_FullFolderIsResourceExhausted: a collective whose data does not
// fit in the shared folder fails on every rank with ErrNoSpace
// (ResourceExhausted, matching ENOSPC), not an argument error, and the
// communicator goes on working with tensors that fit.
func TestShm_FullFolderIsResourceExhausted(t *testing.T) {
	// Two ranks: control files 2 x 132 KiB, then each data file at least
	// 1 MiB: two small allreduces (one per file set) fit in 6 MiB, an
	// allgather of 4 MiB a rank (each publishes all of its input) does
	// not. (An allreduce of any size would: TestShm_AllreduceInSmallFolder.)
	dir := mountShm(t, 6<<20)
	comms, errs := joinIn(t, 2, SHM, dir)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	small := func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
		x, _ := tensordict.Zeros(memmap.Float32, 256)
		return c.Allreduce(ctx, x, Sum)
	}
	all(t, comms, small)
	_, errs = onAll(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
		x, _ := tensordict.Zeros(memmap.Float32, 1<<20)
		return c.Allgather(ctx, x, 0)
	})
	for r, err := range errs {
		switch {
		case err == nil:
			t.Fatalf("rank %d: a 4 MiB allgather in a 6 MiB folder shared by 2 ranks succeeded", r)
		case !errors.Is(err, ErrNoSpace), !errors.Is(err, syscall.ENOSPC), rpc.CodeOf(err) != rpc.ResourceExhausted,
			errors.Is(err, ErrArgument), errors.Is(err, ErrBroken):
			t.Errorf("rank %d: %v (code %v), want ErrNoSpace, ENOSPC, ResourceExhausted", r, err, rpc.CodeOf(err))
		}
	}
	// Both file sets again, with tensors that fit.
	all(t, comms, small)
	all(t, comms, small)
}

// TestShm_AllreduceInSmallFolder: an Allreduce (and a Reduce) needs room
// in the shared folder for a few chunks a rank, not for the tensor: 16 MiB
// a rank through a 6 MiB folder, with the right sums, on every rank.
func TestShm_AllreduceInSmallFolder(t *testing.T) {
	dir := mountShm(t, 6<<20)
	comms, errs := joinIn(t, 2, SHM, dir)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	const n = 4 << 20 // float32s: 16 MiB
	outs := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
		x, _ := tensordict.Zeros(memmap.Float32, n)
		v := as[float32](must1(x.Bytes()))
		for i := range v {
			v[i] = float32(i%1000) + float32(c.Rank())
		}
		if _, err := c.Reduce(ctx, x, Sum, 1); err != nil {
			return nil, err
		}
		return c.Allreduce(ctx, x, Sum)
	})
	for r, o := range outs {
		v := as[float32](must1(o.Bytes()))
		for i := range v {
			if want := 2*float32(i%1000) + 1; v[i] != want {
				t.Fatalf("rank %d: element %d is %v, want %v", r, i, v[i], want)
			}
		}
	}
}

// TestShm_JoinOnFullFolder: Join with a shared folder that has no room
// left does not crash and says why: Auto falls back to TCP, and SHM fails
// with ErrJoin naming the lack of space, on rank 0 (the others get ErrJoin
// too, but may see rank 0 close before its answer reaches them). With no
// room even for rank 0's marker file the folder cannot be made; with room
// for the marker and the lock files, the control files do not fit (their
// pages are reserved before they are written through the mapping, which
// on a full tmpfs is SIGBUS).
func TestShm_JoinOnFullFolder(t *testing.T) {
	for _, tc := range []struct {
		name string
		room int // bytes left free
		why  string
	}{
		{"no room", 0, "cannot make the shared folder"},
		{"no room for the control files", 3 * 4096, "rank-0.ctl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := mountShm(t, 1<<20)
			room := filepath.Join(dir, "room")
			if err := os.WriteFile(room, make([]byte, tc.room), 0o600); err != nil {
				t.Fatal(err)
			}
			fillShm(t, dir)
			os.Remove(room)

			comms, errs := joinIn(t, 2, Auto, dir)
			for r, err := range errs {
				if err != nil {
					t.Fatalf("Auto, rank %d: Join: %v", r, err)
				}
				if got := comms[r].Transport(); got != TCP {
					t.Errorf("Auto, rank %d: transport %v on a full folder, want tcp", r, got)
				}
			}
			all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
				x, _ := tensordict.Zeros(memmap.Float32, 256)
				return c.Allreduce(ctx, x, Sum)
			})
			for _, c := range comms {
				c.Close()
			}

			_, errs = joinIn(t, 2, SHM, dir)
			for r, err := range errs {
				if !errors.Is(err, ErrJoin) {
					t.Errorf("SHM, rank %d: Join: %v, want ErrJoin", r, err)
				}
			}
			switch err := errs[0]; {
			case err != nil && strings.Contains(err.Error(), "no space") && strings.Contains(err.Error(), tc.why):
			case err != nil && tc.room > 0 && strings.Contains(err.Error(), "does not see"):
				// Known weak spot: when the pages the Auto join used are not
				// yet freed, making the folder itself fails and rank 0 reports
				// "does not see" without the ENOSPC (reliability.md). The
				// property this test guards, ErrJoin and no SIGBUS, holds.
				t.Logf("SHM, rank 0: Join: %v (the folder could not be made; the reason is not named)", err)
			default:
				t.Errorf("SHM, rank 0: Join: %v, want it to say %q and no space", err, tc.why)
			}
		})
	}
}
