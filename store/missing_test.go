package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/rpc"
)

// prefixIDs returns the ids of the prefix items of bin, oldest first.
func prefixIDs(s *Store, bin string) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint64
	if b := s.bins[bin]; b != nil {
		for _, it := range b.items {
			if it.inline == nil {
				out = append(out, it.id)
			}
		}
	}
	return out
}

// TestStore_MissingValueCostsThatItemOnly: one value folder deleted under
// a store costs that item only: the bin's other items are read (before and
// after a restart), the store opens, reading the lost item alone fails
// with ErrMissing naming it, and Options.Repair drops it, saying so.
func TestStore_MissingValueCostsThatItemOnly(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	o := Options{InlineBytes: 64, Logger: slog.New(slog.DiscardHandler)}
	s := openT(t, dir, o)
	for i, n := range []int{100, 100, 2} { // two prefixes and an inline item
		if _, err := s.Append(ctx, "b", itemTD(t, int64(i+1), n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Append(ctx, "other", itemTD(t, 9, 100)); err != nil {
		t.Fatal(err)
	}
	lost := prefixIDs(s, "b")[1]
	lostPath := filepath.Join(valuesDir, fmt.Sprintf("%016x", lost))
	if err := os.RemoveAll(filepath.Join(dir, lostPath)); err != nil {
		t.Fatal(err)
	}
	peek := func(s *Store, want []int64) {
		t.Helper()
		got, err := s.Peek(ctx, "b")
		if err != nil {
			t.Fatalf("Peek of a bin with one item lost = %v", err)
		}
		if g := ids(t, got); !slices.Equal(g, want) {
			t.Fatalf("Peek = %v, want %v", g, want)
		}
	}
	peek(s, []int64{1, 3})
	s.Close()

	var logs syncBuffer
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open of a store with one value folder missing = %v", err)
	}
	if !strings.Contains(logs.String(), lostPath) {
		t.Errorf("Open did not report the missing %s:\n%s", lostPath, logs.String())
	}
	peek(s, []int64{1, 3})
	got, err := s.Get(ctx, "b")
	if err != nil || !slices.Equal(ids(t, got), []int64{1, 3}) {
		t.Fatalf("Get = %v, %v; want items 1 and 3", len(got), err)
	}
	closeAll(got)
	_, err = s.Get(ctx, "b")
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), lostPath) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("Get of the lost item = %v, want ErrMissing naming bin b and %s", err, lostPath)
	}
	if bins, _, _ := s.List(ctx); bins["b"] != 1 {
		t.Errorf("List = %v: the lost item is still in the log until repaired", bins)
	}
	if got, err := s.Peek(ctx, "other"); err != nil || len(got) != 1 {
		t.Errorf("Peek of another bin = %d items, %v", len(got), err)
	}
	s.Close()

	logs = syncBuffer{}
	o.Repair = true
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s = openT(t, dir, o)
	if !strings.Contains(logs.String(), "dropped") || !strings.Contains(logs.String(), lostPath) {
		t.Errorf("Repair did not say it dropped %s:\n%s", lostPath, logs.String())
	}
	if got, err := s.Get(ctx, "b"); err != nil || len(got) != 0 {
		t.Errorf("Get after the repair = %d items, %v; want none", len(got), err)
	}
	if got, err := s.Peek(ctx, "other"); err != nil || len(got) != 1 {
		t.Errorf("Peek of another bin after the repair = %d items, %v", len(got), err)
	}
}

// TestStore_MissingLatestVersion: the latest parameter version's folder
// deleted: the store opens, Latest fails with ErrMissing naming it, and a
// new version serves again.
func TestStore_MissingLatestVersion(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	o := Options{Logger: slog.New(slog.DiscardHandler)}
	s := openT(t, dir, o)
	if _, err := s.Publish(ctx, "p", itemTD(t, 1, 10)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	id := s.params["p"].versions[1].id
	s.mu.Unlock()
	path := filepath.Join(valuesDir, fmt.Sprintf("%016x", id))
	os.RemoveAll(filepath.Join(dir, path))
	if _, err := s.Latest(ctx, "p"); !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Latest of a version whose folder is gone = %v, want ErrMissing naming %s", err, path)
	}
	s.Close()
	s = openT(t, dir, o)
	if _, err := s.Latest(ctx, "p"); !errors.Is(err, ErrMissing) {
		t.Fatalf("Latest after a restart = %v, want ErrMissing", err)
	}
	if v, err := s.Publish(ctx, "p", itemTD(t, 2, 10)); err != nil || v != 2 {
		t.Fatalf("Publish = %d, %v", v, err)
	}
	p, err := s.Latest(ctx, "p")
	if err != nil || p.Version != 2 {
		t.Fatalf("Latest = %v, %v", p, err)
	}
	p.Close()
}

// TestStore_StrayValuesAreLeftUntilRepair: value folders no record names
// (a crash between writing one and logging it, or a log that lost its
// records) are left alone by Open, and reported; Options.Repair removes
// them. Files not named as values are never touched.
func TestStore_StrayValuesAreLeftUntilRepair(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, Options{})
	s.Close()
	stray := filepath.Join(dir, valuesDir, "00000000000000ff")
	os.MkdirAll(stray, 0o755)
	notOurs := filepath.Join(dir, valuesDir, "README")
	os.WriteFile(notOurs, []byte("x"), 0o644)
	var logs syncBuffer
	s = openT(t, dir, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := os.Stat(stray); err != nil {
		t.Fatalf("Open removed a value no record names: %v", err)
	}
	if !strings.Contains(logs.String(), "00000000000000ff") {
		t.Errorf("Open did not report the stray value:\n%s", logs.String())
	}
	s.Close()
	logs = syncBuffer{}
	openT(t, dir, Options{Repair: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Repair left a value no record names: %v", err)
	}
	if !strings.Contains(logs.String(), "dropped") || !strings.Contains(logs.String(), "00000000000000ff") {
		t.Errorf("Repair did not say it dropped the stray value:\n%s", logs.String())
	}
	if _, err := os.Stat(notOurs); err != nil {
		t.Fatalf("a file that is not a value was removed: %v", err)
	}
}

// TestStore_RepairOfALostLog: Options.Repair on a store whose log was
// deleted starts a new store there and drops the values no log names,
// saying so.
func TestStore_RepairOfALostLog(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{InlineBytes: 64})
	s.Append(ctx, "b", itemTD(t, 1, 100))
	id := s.ID()
	s.Close()
	os.Remove(filepath.Join(dir, logName))
	var logs syncBuffer
	s = openT(t, dir, Options{Repair: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if s.ID() == id {
		t.Error("the repaired store kept the lost one's id")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, valuesDir)); len(ents) != 0 {
		t.Errorf("%d values left", len(ents))
	}
	if !strings.Contains(logs.String(), "dropped") {
		t.Errorf("Repair did not say what it dropped:\n%s", logs.String())
	}
}

// TestClient_MissingValue: a remote Get of a bin with one item's folder
// deleted returns the others, by reference and by bytes, and then
// ErrMissing (DataLoss) naming the lost one.
func TestClient_MissingValue(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxT(t)
			root := t.TempDir()
			n := serveStore(t, root, "st", Options{InlineBytes: 64, Logger: slog.New(slog.DiscardHandler)})
			c := dialT(t, n.addr, "st", root, mode)
			for i := range 3 {
				if _, err := c.Append(ctx, "b", itemTD(t, int64(i+1), 100)); err != nil {
					t.Fatal(err)
				}
			}
			lost := relValue(prefixIDs(n.s, "b")[1])
			os.RemoveAll(filepath.Join(n.s.Dir(), lost))
			got, err := c.Get(ctx, "b")
			if err != nil || !slices.Equal(ids(t, got), []int64{1, 3}) {
				t.Fatalf("Get = %d items, %v; want 1 and 3", len(got), err)
			}
			closeAll(got)
			_, err = c.Get(ctx, "b")
			if !errors.Is(err, ErrMissing) || !errors.Is(err, rpc.ErrDataLoss) || !strings.Contains(err.Error(), lost) {
				t.Fatalf("Get of the lost item = %v, want ErrMissing naming %s", err, lost)
			}
		})
	}
}

// TestStore_StrayValueIDIsNotReused: a value folder renamed into values/
// whose record never followed (a kill -9 between the two) is left alone at
// Open, and its id is not handed out again: the next value used to be
// written to the same id and its rename failed ("file exists"; seen in
// TestProcess_NodeKilledAndRestarted/ref).
func TestStore_StrayValueIDIsNotReused(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{InlineBytes: 64})
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 100)); err != nil {
		t.Fatal(err)
	}
	next := s.nextID.Load() + 1
	s.Close()
	if err := os.MkdirAll(filepath.Join(dir, relValue(next)), 0o755); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{InlineBytes: 64})
	for i := range 3 {
		if _, err := s.Append(ctx, "b", itemTD(t, int64(2+i), 100)); err != nil {
			t.Fatalf("append %d after a stray value folder: %v", i, err)
		}
	}
}
