package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// A caller whose context ends while its Get is between the node's reply
// and the acknowledgement still gets the items: they were removed for it.
// Before, Get dropped them and the node held them for GetTimeout, so a
// drain that stopped at an empty bin lost them (faulttest's
// TestStoreAcrossHosts saw "2 acknowledged appends lost" under load).
func TestClient_GetCancelledAfterTakeLosesNothing(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveStore(t, root, "st", Options{InlineBytes: 512, GetTimeout: time.Hour})
			c := dialT(t, n.addr, "st", root, mode)
			for i, size := range []int{4, 2000, 8} {
				if _, err := c.Append(ctxT(t), "b", itemTD(t, int64(i), size)); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(ctxT(t))
			testAfterTake = cancel
			t.Cleanup(func() { testAfterTake = nil })
			got, err := c.Get(ctx, "b")
			testAfterTake = nil
			if err != nil {
				t.Fatalf("Get whose context ended after the node's reply: %v (its items are held for GetTimeout)", err)
			}
			if g := ids(t, got); !slices.Equal(g, []int64{0, 1, 2}) {
				t.Fatalf("Get = %v, want [0 1 2]", g)
			}
			if again, err := c.Get(ctxT(t), "b"); err != nil || len(again) != 0 {
				t.Fatalf("second Get: %d items, %v (an item drained twice)", len(again), err)
			}
		})
	}
}

// A Get whose context ends while its take is still on its way to the node
// gives it back (ack Drop), and the Drop may reach the node first: the take
// that comes after it must not hold the items. Before, it held them for
// GetTimeout, and a drain that stopped at the empty Get that followed lost
// them (faulttest's TestStoreAcrossHosts: "489 acknowledged appends lost").
func TestClient_GetGivenBackBeforeItsTakeLosesNothing(t *testing.T) {
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{GetTimeout: time.Hour})
	c := dialT(t, n.addr, "st", root, "bytes")
	for i := range 3 {
		if _, err := c.Append(ctxT(t), "b", itemTD(t, int64(i), 8)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	dropped := make(chan uint64, 1)
	testAfterDrop = func(id uint64) { dropped <- id }
	testBeforeTake = func(id uint64) {
		testBeforeTake = nil
		cancel() // the caller gives up; its Get gives the take back
		select {
		case d := <-dropped:
			if d != id {
				t.Errorf("the node was given back take %x, want %x", d, id)
			}
		case <-time.After(30 * time.Second):
			t.Error("the Get never gave its take back")
		}
	}
	t.Cleanup(func() { testBeforeTake, testAfterDrop = nil, nil })
	if _, err := c.Get(ctx, "b"); err == nil {
		t.Fatal("a Get whose context ended before the node's reply succeeded")
	}
	got, err := c.Get(ctxT(t), "b")
	if err != nil {
		t.Fatal(err)
	}
	if g := ids(t, got); !slices.Equal(g, []int64{0, 1, 2}) {
		t.Fatalf("the Get after = %v, want [0 1 2]: the take given back holds the items", g)
	}
}

// A Peek by reference whose item a Get removes between the node's answer
// and its mapping peeks again, as documented, rather than failing: the
// item's folder is gone (renamed into trash/), and LoadMemmap alone
// reported only "meta.json is missing" (ErrFormat), which Peek did not
// take for a removal.
func TestClient_PeekOfAnItemRemovedMeanwhile(t *testing.T) {
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{InlineBytes: 512})
	c := dialT(t, n.addr, "st", root, "ref")
	other := dialT(t, n.addr, "st", root, "ref")
	if _, err := c.Append(ctxT(t), "b", itemTD(t, 7, 2000)); err != nil {
		t.Fatal(err)
	}
	testBeforeMap = func() {
		testBeforeMap = nil
		got, err := other.Get(ctxT(t), "b")
		if err != nil || len(got) != 1 {
			t.Errorf("the Get in the middle: %d items, %v", len(got), err)
		}
		closeAll(got)
	}
	t.Cleanup(func() { testBeforeMap = nil })
	got, err := c.Peek(ctxT(t), "b")
	if err != nil {
		t.Fatalf("Peek whose item a Get removed meanwhile: %v, want it to peek again", err)
	}
	if len(got) != 0 {
		t.Fatalf("Peek = %d items, want the bin's content after the Get (none)", len(got))
	}
}

// TestTakeAs_GivenBackWhileTaking: a Get given back (ack Drop) while its
// take is being made holds no item afterwards. takeAs checked the given
// back ids under the store's lock, released it, and takeItemsAs made the
// take under the lock again: a drop landing between the two was missed,
// and the take held every item of the bin from other Gets for GetTimeout
// (failed on the first attempts before the fix).
func TestTakeAs_GivenBackWhileTaking(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{NoSync: true, InlineBytes: 1, GetTimeout: time.Hour})
	var tds []*tensordict.TensorDict
	for i := range 400 {
		tds = append(tds, itemTD(t, int64(i), 1))
	}
	if _, err := s.Extend(ctx, "b", tds); err != nil {
		t.Fatal(err)
	}
	drop := func(id uint64) { // Service.ack with Drop
		s.mu.Lock()
		s.dropTakeLocked(id)
		s.dropped.add(id)
		s.mu.Unlock()
	}
	for attempt := range 200 {
		id := uint64(1000 + attempt)
		done := make(chan error, 1)
		go func() {
			_, err := s.takeAs("b", id, time.Hour)
			done <- err
		}()
		time.Sleep(time.Duration(attempt%20) * 50 * time.Microsecond)
		drop(id)
		err := <-done
		s.mu.Lock()
		held := s.takes[id] != nil
		s.mu.Unlock()
		if held {
			t.Fatalf("attempt %d: take %d was given back (ack Drop) but holds the bin's items (takeAs: %v)", attempt, id, err)
		}
	}
}
