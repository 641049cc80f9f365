package benchkit

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPickRows_Distinct(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]int, 5)
	for range 1000 {
		PickRows(rng, 6, rows)
		s := slices.Clone(rows)
		slices.Sort(s)
		if len(slices.Compact(s)) != 5 || s[0] < 0 || s[4] >= 6 {
			t.Fatalf("rows %v are not 5 distinct indices in [0, 6)", rows)
		}
	}
}

func TestBuffers(t *testing.T) {
	if b := Touched(4097); !bytes.Equal(b, bytes.Repeat([]byte{0x5a}, 4097)) {
		t.Error("Touched did not write every byte")
	}
	a, err := Anon(8192)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, bytes.Repeat([]byte{0xa5}, 8192)) {
		t.Error("Anon did not write every byte")
	}
	FlushCache(a)
	if err := Free(a); err != nil {
		t.Fatal(err)
	}
}

// TestDropMappings_ColdAfterEvict checks the two-step eviction on a file
// mapped twice: fadvise alone leaves pages that a mapping still holds in
// the page cache; after DropMappings the same fadvise evicts them.
func TestDropMappings_ColdAfterEvict(t *testing.T) {
	const size = 16 << 12
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Repeat([]byte{7}, size)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	var maps [2][]byte
	for i := range maps {
		prot := unix.PROT_READ
		flags := unix.MAP_PRIVATE
		if i == 0 {
			prot, flags = unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED
		}
		if maps[i], err = unix.Mmap(int(f.Fd()), 0, size, prot, flags); err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(maps[i])
		FlushCache(maps[i][:]) // touch every page
	}
	fadvise := func() {
		if err := unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
	}
	fadvise()
	if res, pages, err := Resident(maps[0]); err != nil || pages != 16 {
		t.Fatalf("Resident = %d, %d, %v", res, pages, err)
	} else {
		t.Logf("after fadvise alone: %d of %d pages resident", res, pages)
	}
	n, err := DropMappings(maps[0][100:])
	if err != nil || n != 2 {
		t.Fatalf("DropMappings = %d, %v; want both mappings", n, err)
	}
	fadvise()
	if res, _, _ := Resident(maps[1]); res != 0 {
		t.Errorf("%d pages resident after DropMappings and fadvise", res)
	}
	if maps[0][size-1] != 7 || maps[1][0] != 7 {
		t.Error("data changed")
	}
	if _, err := DropMappings(make([]byte, 8)); err == nil {
		t.Error("DropMappings accepted heap memory")
	}
}

func TestOnInterrupt_CancelsOnSignal(t *testing.T) {
	ctx, stop := OnInterrupt(context.Background())
	defer stop()
	if err := unix.Kill(os.Getpid(), unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not cancel the context")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) || !strings.Contains(cause.Error(), "terminated") {
		t.Errorf("cause %v does not name the signal", cause)
	}

	ctx2, stop2 := OnInterrupt(context.Background())
	stop2()
	if ctx2.Err() == nil {
		t.Error("stop did not cancel the context")
	}
	parent, cancel := context.WithCancel(context.Background())
	ctx3, stop3 := OnInterrupt(parent)
	defer stop3()
	cancel()
	if ctx3.Err() == nil {
		t.Error("cancelling the parent did not cancel the context")
	}
}

// TestOnInterrupt_SecondSignalEnds runs a process that waits for its
// context, then signals itself again: the second SIGTERM must end it.
func TestOnInterrupt_SecondSignalEnds(t *testing.T) {
	if os.Getenv("BENCHKIT_HELPER") == "interrupt" {
		ctx, stop := OnInterrupt(context.Background())
		defer stop()
		unix.Kill(os.Getpid(), unix.SIGTERM)
		<-ctx.Done()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			unix.Kill(os.Getpid(), unix.SIGTERM) // until the default action ends this process
		}
		os.Exit(0) // the second signal was caught: the parent sees status 0
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOnInterrupt_SecondSignalEnds$")
	cmd.Env = append(os.Environ(), "BENCHKIT_HELPER=interrupt")
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the helper exited with %v, want death by SIGTERM", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("the helper ended with %v, want death by SIGTERM", err)
	}
}

func TestCheckRow(t *testing.T) {
	for _, tc := range []struct {
		row  []byte
		want byte
		ok   bool
	}{
		{[]byte{7, 7, 7}, 7, true},
		{[]byte{}, 7, true},
		{[]byte{7, 6, 7}, 7, false},
		{[]byte{0, 0, 1}, 0, false},
	} {
		err := CheckRow(3, tc.row, tc.want)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrMismatch)) {
			t.Errorf("CheckRow(%v, %d) = %v", tc.row, tc.want, err)
		}
	}
	if err := CheckRow(3, []byte{7, 6}, 7); err == nil || !strings.Contains(err.Error(), "row 3 byte 1 is 6, want 7") {
		t.Errorf("error %v does not name the first differing byte", err)
	}
}
