package replay

import (
	"errors"
	"path/filepath"
	"testing"
)

// A node killed while its commit marked a batch's slots committed, one by
// one, leaves the batch's first slots committed and the rest writing. The
// writer had no reply: its commit, retried on the restarted node, gets
// ErrExpired, and it extends the batch again. The reopened buffer must not
// hold the first rows of the cut commit as well (the fault suite's
// TestEpisodes_NodeKilled saw an episode's step twice, "step 50 after step
// 50"): the batch is in once, its episode's steps consecutive.
func TestRecover_CommitCutShort(t *testing.T) {
	ctx := ctxT(t)
	for _, marked := range []int{1, 2} { // slots of 3 marked when the node died
		dir := t.TempDir()
		b, err := Create(filepath.Join(dir, "buf"), Config{Capacity: 16, Schema: stepSchema, TrajKey: []string{"episode"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Extend(ctx, steps(t, 1, 0, 3)); err != nil {
			t.Fatal(err)
		}
		// Steps [3, 6): reserved, written, and the commit cut after it
		// marked its first slots, as commit does them.
		r, storage, err := b.reserve(ctx, stepSchema, 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeRows(storage, r.slots, steps(t, 1, 3, 6)); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		for _, s := range r.slots[:marked] {
			b.slots.setPriority(s, 1)
			b.slots.setKey(s, 0)
			b.slots.setWord(s, makeWord(gen(b.slots.word(s)), stateCommitted))
		}
		b.mu.Unlock()
		killed := filepath.Join(dir, "killed") // the files as the killed node left them
		copyDir(t, filepath.Join(dir, "buf"), killed)
		b.Close()

		rb, err := Open(killed)
		if err != nil {
			t.Fatal(err)
		}
		if n := rb.Len(); n != 3 {
			t.Errorf("%d of 3 marked: reopened with %d transitions, want the 3 acknowledged", marked, n)
		}
		if _, err := rb.commit(r.rid, r.slots, nil); !errors.Is(err, ErrExpired) {
			t.Errorf("%d of 3 marked: the retried commit: %v, want ErrExpired", marked, err)
		}
		if _, err := rb.Extend(ctx, steps(t, 1, 3, 6)); err != nil { // what Extend does on ErrExpired
			t.Fatal(err)
		}
		wantEpisodes(t, rb, map[int64]int{1: 6})
		rb.Close()
	}
}
