package replay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
)

// helperEpisodeNode opens the buffer at $ROOT/buf, or creates it with
// trajectories (stepSchema, TrajKey episode, capacity 4096), and serves it
// on $ADDR until killed.
func helperEpisodeNode() error {
	root := os.Getenv(envRoot)
	b, err := Open(filepath.Join(root, "buf"))
	if errors.Is(err, ErrNotFound) {
		b, err = Create(filepath.Join(root, "buf"), Config{Capacity: 4096, Schema: stepSchema, TrajKey: []string{"episode"}})
	}
	if err != nil {
		return err
	}
	return svctest.ServeHelper(root, os.Getenv(envAddr), Register, "buf", b)
}

// TestProcess_NodeKilledMidEpisode: three actors append the steps of their
// episodes, two a call, interleaved, while a trainer samples slices; the
// node is killed with SIGKILL in the middle of their episodes and started
// again. The actors carry on, their episodes continuing; at the end every
// acknowledged step is in its episode, at its place, and every slice
// sampled (across the kill too) was one episode's consecutive steps.
func TestProcess_NodeKilledMidEpisode(t *testing.T) {
	root := t.TempDir()
	env := []string{envHelper + "=episode-node", envRoot + "=" + root}
	node, addr := proctest.StartServer(t, env...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stop atomic.Bool
	var mu sync.Mutex
	acked := map[int64][]int{} // episode -> slots of its acknowledged steps, in order
	var nacked, nslices atomic.Int64
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for a := range 3 {
		c := dialBuffer(t, addr, "buf", root, modes[a%2])
		wg.Go(func() {
			for ep := int64(a + 1); !stop.Load(); ep += 3 {
				for step := 0; step < 24; step += 2 {
					idx, err := c.Extend(ctx, steps(t, ep, step, step+2))
					if err != nil {
						errs <- fmt.Errorf("episode %d step %d: %w", ep, step, err)
						return
					}
					mu.Lock()
					acked[ep] = append(acked[ep], idx...)
					mu.Unlock()
					nacked.Add(2)
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	trainer := dialBuffer(t, addr, "buf", root, "bytes")
	wg.Go(func() {
		spec := SliceSpec{SliceLen: 8, NumSlices: 4}
		for !stop.Load() {
			td, info, err := trainer.SampleSlices(ctx, spec)
			if err != nil {
				errs <- fmt.Errorf("sample slices: %w", err)
				return
			}
			if err := checkSlices(info, td, spec); err != nil {
				errs <- err
				return
			}
			nslices.Add(4)
		}
	})
	waitFor := func(what string, n *atomic.Int64, above int64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); n.Load() <= above; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) || len(errs) > 0 {
				t.Fatalf("%s: %d after 30 s (from %d)", what, n.Load(), above)
			}
		}
	}
	waitFor("steps before the kill", &nacked, 100)
	waitFor("slices before the kill", &nslices, 0)
	node.Kill()
	ackedAtKill, slicesAtKill := nacked.Load(), nslices.Load()
	time.Sleep(200 * time.Millisecond)
	node, _ = proctest.StartServer(t, append(env, envAddr+"="+addr)...)
	waitFor("steps after the restart", &nacked, ackedAtKill+100)
	waitFor("slices after the restart", &nslices, slicesAtKill)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	node.Kill()

	b, err := Open(filepath.Join(root, "buf"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := map[int64][]int{}
	for _, e := range b.Episodes() {
		got[e.ID] = e.Slots
	}
	for ep, want := range acked {
		if !slices.Equal(got[ep], want) {
			t.Fatalf("episode %d: the reopened buffer has steps at %v; acknowledged at %v", ep, got[ep], want)
		}
	}
	if len(got) != len(acked) {
		t.Fatalf("%d episodes reopened, %d written", len(got), len(acked))
	}
	wantEpisodes(t, b, nil)
	t.Logf("%d steps acknowledged (%d at the kill) in %d episodes, all in place; %d slices sampled (%d before the kill)",
		nacked.Load(), ackedAtKill, len(acked), nslices.Load(), slicesAtKill)
}
