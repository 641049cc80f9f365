package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// inTrash returns the entries of dir's trash/ whose meta.json is still
// there (readable by a reader that mapped them).
func inTrash(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, trashDir))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(dir, trashDir, e.Name(), "meta.json")); err == nil {
			n++
		}
	}
	return n
}

// TestStore_DeletedValueWaitsInTrash: a value deleted (a Get's item, a
// Deleted bin's, a superseded parameter version) is renamed into trash/ and
// unlinked only after Options.TrashGrace, across a restart too, so that a
// reader on another machine (NFS: its own page cache, no silly rename)
// that still maps it keeps reading files that are there.
func TestStore_DeletedValueWaitsInTrash(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	o := Options{InlineBytes: 64, TrashGrace: 5 * time.Second}
	s := openT(t, dir, o)
	s.Append(ctx, "a", itemTD(t, 1, 100))
	s.Append(ctx, "b", itemTD(t, 2, 100))
	got, err := s.Get(ctx, "a")
	if err != nil || len(got) != 1 {
		t.Fatalf("Get = %d, %v", len(got), err)
	}
	closeAll(got)
	if _, err := s.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	s.Publish(ctx, "p", itemTD(t, 3, 10))
	s.Publish(ctx, "p", itemTD(t, 4, 10)) // version 1 goes: nobody leases it
	// A superseded version is collected once its successor is durable
	// (the log's syncer, a moment after Publish returns; the race detector
	// on 2 loaded cores showed 2 of 3 at once): wait for it, well within
	// the grace.
	for deadline := time.Now().Add(3 * time.Second); inTrash(t, dir) != 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := inTrash(t, dir); n != 3 {
		t.Fatalf("%d values in trash/ right after their deletion, want 3 (the Get's, the Delete's, version 1)", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, valuesDir)); len(ents) != 1 {
		t.Fatalf("%d values under values/, want 1 (version 2)", len(ents))
	}
	s.Close()
	openT(t, dir, o) // a restart keeps them for their grace too
	if n := inTrash(t, dir); n != 3 {
		t.Fatalf("%d values in trash/ after a restart within the grace, want 3", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for inTrash(t, dir) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d values still in trash/ long after the grace", inTrash(t, dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
