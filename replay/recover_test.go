package replay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// crashed returns the buffer at dir/buf reopened from a copy of its files
// as they are now (what a node killed by kill -9 leaves), after closing
// the original.
func crashed(t *testing.T, b *Buffer, dir string) *Buffer {
	t.Helper()
	killed := filepath.Join(dir, "killed")
	copyDir(t, filepath.Join(dir, "buf"), killed)
	b.Close()
	rb, err := Open(killed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rb.Close() })
	return rb
}

func episodeBuffer(t *testing.T, dir string) *Buffer {
	t.Helper()
	b, err := Create(filepath.Join(dir, "buf"), Config{Capacity: 16, Schema: stepSchema, TrajKey: []string{"episode"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Extend(ctxT(t), steps(t, 1, 0, 3)); err != nil {
		t.Fatal(err)
	}
	return b
}

// A node killed while its commit marked a batch's slots committed, one by
// one, leaves the batch's first slots committed and the rest writing. The
// writer had no reply and retries the commit on the restarted node. The
// batch must then be in once: the fault suite's TestEpisodes_NodeKilled
// saw an episode hold a step twice ("step 50 after step 50") when Open
// emptied the slots not yet marked, the retry failed with ErrExpired, and
// the writer extended the batch again. Open finishes such a commit; one
// killed before it marked any slot is gone, and the retry's ErrExpired
// has the writer extend again.
func TestRecover_CommitCutShort(t *testing.T) {
	ctx := ctxT(t)
	for _, marked := range []int{0, 1, 2} { // slots of 3 marked when the node died
		dir := t.TempDir()
		b := episodeBuffer(t, dir)
		// Steps [3, 6): reserved, written, and the commit cut after it
		// wrote the priorities and keys and marked its first slots, as
		// commit does them.
		r, storage, err := b.reserve(ctx, stepSchema, 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeRows(storage, r.slots, steps(t, 1, 3, 6)); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		for _, s := range r.slots {
			b.slots.setPriority(s, 1)
			b.slots.setKey(s, 0)
		}
		for _, s := range r.slots[:marked] {
			b.slots.setWord(s, makeWord(gen(b.slots.word(s)), stateCommitted))
		}
		b.mu.Unlock()
		rb := crashed(t, b, dir)

		idx, err := rb.commit(r.rid, r.slots, nil) // the writer's retry
		switch {
		case marked == 0 && !errors.Is(err, ErrExpired):
			t.Fatalf("none marked: the retried commit: %v, want ErrExpired", err)
		case marked == 0:
			if _, err := rb.Extend(ctx, steps(t, 1, 3, 6)); err != nil { // what Extend does on ErrExpired
				t.Fatal(err)
			}
		case err != nil || !slices.Equal(idx, r.slots):
			t.Fatalf("%d of 3 marked: the retried commit: %v, %v; want the reserved slots %v", marked, idx, err, r.slots)
		}
		if n := rb.Len(); n != 6 {
			t.Errorf("%d of 3 marked: %d transitions after the retry, want 6", marked, n)
		}
		wantEpisodes(t, rb, map[int64]int{1: 6})
	}
}

// A node killed while reserve took a committed slot, after it turned the
// slot writing and before it gave it the new reservation's seq, leaves a
// writing slot that still holds, whole, the row of the committed batch
// its seq names. Open keeps it: the batch was acknowledged. (Emptying
// every slot of a reservation that has one writing, which an earlier fix
// for the commit above did, lost such a batch whole.)
func TestRecover_ReserveCutShort(t *testing.T) {
	dir := t.TempDir()
	b := episodeBuffer(t, dir)
	s := b.Episodes()[0].Slots[1]
	b.mu.Lock()
	b.slots.setWord(s, makeWord(gen(b.slots.word(s))+1, stateWriting))
	b.mu.Unlock()
	rb := crashed(t, b, dir)
	if n := rb.Len(); n != 3 {
		t.Errorf("reopened with %d transitions, want the 3 acknowledged", n)
	}
	wantEpisodes(t, rb, map[int64]int{1: 3})
}

// The node killed after every single write of a reserve and a commit to
// the slot table, in the order the code writes (testSlotWritten copies
// the files there), while a batch of 3 of episode 2 goes over slots of
// episode 1: two empty ones and one holding an acknowledged step, or one
// whose step was deleted and two holding acknowledged steps. Each copy is
// reopened and the writer does what it would: retries the commit, and
// extends the batch again if that fails with ErrExpired (a kill during
// reserve ends there too). Every time, episode 2 is in once, steps 0-2 in
// order; episode 1 is a run ending at its last step, holding every
// acknowledged step that no batch overwrote; the deleted step does not
// come back, at the reopening or after.
func TestRecover_KilledAtEveryWrite(t *testing.T) {
	for _, tc := range []struct {
		name    string
		steps   int   // episode 1's, in slots 0, 1, ... of 8
		deleted int   // episode 1's step deleted before the batch; -1: none
		slots   []int // where the batch goes
	}{
		{"two empty slots and an acknowledged one", 6, -1, []int{6, 7, 0}},
		{"a deleted step's slot and two acknowledged", 8, 0, []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			dir := t.TempDir()
			b, err := Create(filepath.Join(dir, "buf"), Config{Capacity: 8, Schema: stepSchema, TrajKey: []string{"episode"}})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ack, err := b.Extend(ctx, steps(t, 1, 0, tc.steps))
			if err != nil {
				t.Fatal(err)
			}
			if tc.deleted >= 0 {
				if n, err := b.Delete(ctx, SampleInfo{Indices: ack[tc.deleted : tc.deleted+1]}); n != 1 || err != nil {
					t.Fatalf("delete: %d, %v", n, err)
				}
			}
			var kills []string
			testSlotWritten = func() {
				k := filepath.Join(dir, fmt.Sprintf("kill%02d", len(kills)))
				copyDir(t, filepath.Join(dir, "buf"), k)
				kills = append(kills, k)
			}
			slots, err := b.Extend(ctx, steps(t, 2, 0, 3))
			testSlotWritten = nil
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(slots, tc.slots) {
				t.Fatalf("the batch went to slots %v, want %v", slots, tc.slots)
			}
			rid := b.slots.rid(slots[0])
			if len(kills) != 12 {
				t.Fatalf("%d writes to the slot table, want 12 (2 a slot in reserve, 2 in commit)", len(kills))
			}
			for i, k := range kills {
				rb, err := Open(k)
				if err != nil {
					t.Fatal(err)
				}
				if tc.deleted >= 0 { // before the retry, which may overwrite it
					eps, st := rowsOf(t, rb)
					if s := ack[tc.deleted]; eps[s] == 1 && st[s] == int64(tc.deleted) && state(rb.slots.word(s)) == stateCommitted {
						t.Errorf("killed after write %d: episode 1's deleted step %d is back in slot %d", i, tc.deleted, s)
					}
				}
				_, err = rb.commit(rid, slots, nil)
				if errors.Is(err, ErrExpired) {
					_, err = rb.Extend(ctx, steps(t, 2, 0, 3))
				}
				if err != nil {
					t.Fatalf("killed after write %d: %v", i, err)
				}
				held := wantEpisodes(t, rb, nil) // each episode's steps consecutive, every committed step in one
				ep1, ep2 := held[1], held[2]
				if !slices.Equal(ep2, []int64{0, 1, 2}) || len(ep1) == 0 || ep1[len(ep1)-1] != int64(tc.steps-1) ||
					slices.Contains(ep1, int64(tc.deleted)) {
					t.Errorf("killed after write %d and retried: episode 1 steps %v (want a run ending at %d, without %d), "+
						"episode 2 %v (want 0-2)", i, ep1, tc.steps-1, tc.deleted, ep2)
				}
				// The retried batch may overwrite more of episode 1; no slot
				// outside the cut batch that still holds its acknowledged
				// step is dropped.
				eps, st := rowsOf(t, rb)
				for s := range tc.steps {
					if !slices.Contains(slots, s) && eps[s] == 1 && st[s] == int64(s) && state(rb.slots.word(s)) != stateCommitted {
						t.Errorf("killed after write %d: slot %d holds episode 1's acknowledged step %d, not in the buffer", i, s, s)
					}
				}
				rb.Close()
			}
		})
	}
}

// TestOpen_ReservationIDsAreNeverReused: a reopened buffer hands out no
// reservation id an earlier process did, so that a writer's commit retried
// across the restart can never be taken for another writer's
// reservation. Two ways left ids out of the slot table, from which Open
// used to resume them: a top-k writer that drops a whole batch writes its
// id nowhere, and a machine crash loses the slot table's last writes
// (here: the file put back as it was before the reservation). Before the
// fix, Open handed out the same id again, and the first writer's stale
// commit committed the second writer's slot before it had written its row.
func TestOpen_ReservationIDsAreNeverReused(t *testing.T) {
	ctx := ctxT(t)
	for _, lost := range []string{"dropped by top-k", "lost in a crash"} {
		t.Run(lost, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "buf")
			cfg := Config{Capacity: 2}
			key := func(float64) []float64 { return nil } // a top-k writer's keys
			if lost == "dropped by top-k" {
				cfg.Writer = TopK("reward")
				key = func(k float64) []float64 { return []float64{k} }
			}
			b, err := Create(prefix, cfg)
			if err != nil {
				t.Fatal(err)
			}
			extend(t, b, 5, 9)
			table, err := os.ReadFile(filepath.Join(prefix, SlotsFile))
			if err != nil {
				t.Fatal(err)
			}
			old, _, err := b.reserve(ctx, testSchema, 1, key(1)) // top-k: smaller than 5 and 9, dropped
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil { // the node restarts before the commit reaches it
				t.Fatal(err)
			}
			if lost == "lost in a crash" {
				if err := os.WriteFile(filepath.Join(prefix, SlotsFile), table, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if b, err = Open(prefix); err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			r, _, err := b.reserve(ctx, testSchema, 1, key(10)) // another writer's; it has not written yet
			if err != nil {
				t.Fatal(err)
			}
			if r.rid <= old.rid {
				t.Fatalf("the reopened buffer handed out id %d; the process before it had handed out %d", r.rid, old.rid)
			}
			if _, err := b.commit(old.rid, old.slots, nil); !errors.Is(err, ErrExpired) { // the first writer's retry
				t.Fatalf("the stale commit of reservation %d: %v, want ErrExpired", old.rid, err)
			}
			if st := stats(t, b); st.Pending != 1 {
				t.Fatalf("the stale commit of reservation %d (slots %v) committed reservation %d (slots %v) before its writer wrote: %+v",
					old.rid, old.slots, r.rid, r.slots, st)
			}
		})
	}
}
