package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func valueDirs(t testing.TB, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, valuesDir))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestStore_PublishLatestWaitNewer(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	if _, err := s.Latest(ctx, "p"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Latest before any Publish = %v, want ErrNotFound", err)
	}
	got := make(chan *Param, 1)
	errs := make(chan error, 1)
	go func() {
		p, err := s.WaitNewer(ctx, "p", 0)
		got <- p
		errs <- err
	}()
	v, err := s.Publish(ctx, "p", itemTD(t, 10, 1000))
	if err != nil || v != 1 {
		t.Fatalf("Publish = %d, %v", v, err)
	}
	p := <-got
	if err := <-errs; err != nil || p.Version != 1 || idOf(t, p.TD) != 10 {
		t.Fatalf("WaitNewer(0) = %+v, %v", p, err)
	}
	if x, _ := p.TD.Tensor("x"); !x.Mapped() {
		t.Error("parameters in process are not a mapping")
	}
	// v1 is leased by p: publishing v2 keeps it.
	if v, _ := s.Publish(ctx, "p", itemTD(t, 20, 1000)); v != 2 {
		t.Fatalf("second Publish = %d", v)
	}
	if n := valueDirs(t, dir); n != 2 {
		t.Fatalf("%d versions on disk while v1 is leased, want 2", n)
	}
	p.Close()
	if n := valueDirs(t, dir); n != 1 {
		t.Fatalf("%d versions on disk after the lease ended, want 1", n)
	}
	// Unleased old versions go at once.
	s.Publish(ctx, "p", itemTD(t, 30, 1000))
	if n := valueDirs(t, dir); n != 1 {
		t.Fatalf("%d versions on disk, want 1", n)
	}
	l, err := s.Latest(ctx, "p")
	if err != nil || l.Version != 3 || idOf(t, l.TD) != 30 {
		t.Fatalf("Latest = %+v, %v", l, err)
	}
	l.Close()
	// WaitNewer with an old version returns at once; with the latest it
	// waits until ctx ends.
	if p, err := s.WaitNewer(ctx, "p", 1); err != nil || p.Version != 3 {
		t.Fatalf("WaitNewer(1) = %+v, %v", p, err)
	} else {
		p.Close()
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := s.WaitNewer(short, "p", 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitNewer(latest) = %v, want the deadline", err)
	}
}

func TestStore_LeaseExpiryFreesVersion(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{LeaseTTL: 40 * time.Millisecond})
	s.Publish(ctx, "p", itemTD(t, 1, 10))
	// A remote reader's lease, taken for longer than a Publish can take
	// on a loaded machine, so that it is live when checked ...
	info, err := s.readVersion(ctx, "p", 0, false, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s.Publish(ctx, "p", itemTD(t, 2, 10))
	if n := valueDirs(t, dir); n != 2 {
		t.Fatalf("%d versions on disk under a live lease, want 2", n)
	}
	// ... then renewed once for a moment and never again: its reader died.
	if lost := s.renew([]leaseRef{{ID: info.lease, Name: "p", Version: 1}}, time.Millisecond); len(lost) != 0 {
		t.Fatalf("renewing a live lease: lost %v", lost)
	}
	for deadline := time.Now().Add(30 * time.Second); valueDirs(t, dir) != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the version of an expired lease was never deleted")
		}
	}
	// Renewing the lost lease says so.
	if lost := s.renew([]leaseRef{{ID: info.lease, Name: "p", Version: 1}}, time.Second); len(lost) != 1 {
		t.Fatalf("renewing a lease whose version is gone: lost %v", lost)
	}
	// Renewing a lease the node forgot, whose version is there, takes it again.
	if lost := s.renew([]leaseRef{{ID: 77, Name: "p", Version: 2}}, time.Minute); len(lost) != 0 {
		t.Fatalf("renewing a forgotten lease of a live version: lost %v", lost)
	}
	s.Publish(ctx, "p", itemTD(t, 3, 10))
	if n := valueDirs(t, dir); n != 2 {
		t.Fatalf("%d versions on disk, want 2 (v2 leased again)", n)
	}
}

func TestStore_VersionsSurviveReopenForOneLease(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s, _ := Open(dir, Options{})
	s.Publish(ctx, "p", itemTD(t, 1, 10))
	p, _ := s.Latest(ctx, "p")
	s.Publish(ctx, "p", itemTD(t, 2, 10))
	p.Close() // frees v1
	s.Publish(ctx, "p", itemTD(t, 3, 10))
	info, _ := s.readVersion(ctx, "p", 0, false, time.Minute) // v3 leased by a remote reader
	s.Publish(ctx, "p", itemTD(t, 4, 10))
	s.Close()
	s = openT(t, dir, Options{LeaseTTL: 50 * time.Millisecond})
	if n := valueDirs(t, dir); n != 2 {
		t.Fatalf("%d versions after reopening, want 2 (v3 for its reader, v4)", n)
	}
	if lost := s.renew([]leaseRef{{ID: info.lease, Name: "p", Version: 3}}, time.Minute); len(lost) != 0 {
		t.Fatal("the reader's lease could not be taken again after the restart")
	}
	time.Sleep(100 * time.Millisecond)
	s.expire(time.Now())
	if n := valueDirs(t, dir); n != 2 {
		t.Fatalf("%d versions, want 2 (v3 renewed)", n)
	}
}

// TestWaitNewer_EndsWhenTheStoreStops: a WaitNewer already waiting when the
// store stops (its log deleted: ErrLost) fails with the store's error, as
// every call then does. Before the fix it waited for a publication that
// could not come, until its context ended.
func TestWaitNewer_EndsWhenTheStoreStops(t *testing.T) {
	ctx := ctxT(t)
	dir := filepath.Join(t.TempDir(), "st")
	s := openT(t, dir, Options{})
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 1)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		p, err := s.WaitNewer(ctx, "params", 0)
		if p != nil {
			p.Close()
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // WaitNewer is waiting
	os.Remove(filepath.Join(dir, logName))
	if _, err := s.Append(ctx, "b", itemTD(t, 2, 1)); !errors.Is(err, ErrLost) {
		t.Fatalf("Append after the log was deleted = %v, want ErrLost", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrLost) {
			t.Fatalf("WaitNewer = %v, want ErrLost", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("WaitNewer still waiting 3s after the store stopped (ErrLost); it ends only with its context")
	}
}
