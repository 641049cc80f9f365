package store

import (
	"context"
	"errors"
	"testing"
)

// collect reads n events from a watch.
func watchN(t testing.TB, ctx context.Context, s *Store, prefix string, after uint64, n int) []Event {
	t.Helper()
	var out []Event
	for e, err := range s.Watch(ctx, prefix, after) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
		if len(out) == n {
			break
		}
	}
	return out
}

func TestStore_WatchEvents(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{})
	s.Put(ctx, "roll-a", itemTD(t, 1, 1))
	s.Append(ctx, "roll-a", itemTD(t, 2, 1))
	s.Append(ctx, "other", itemTD(t, 3, 1))
	s.Get(ctx, "roll-a")
	s.Delete(ctx, "other")
	s.Publish(ctx, "roll-params", itemTD(t, 4, 1))
	want := []Event{
		{Revision: 1, Op: OpPut, Name: "roll-a", Items: 1},
		{Revision: 2, Op: OpAppend, Name: "roll-a", Items: 2},
		{Revision: 4, Op: OpGet, Name: "roll-a", Items: 0},
		{Revision: 6, Op: OpPublish, Name: "roll-params", Version: 1},
	}
	got := watchN(t, ctx, s, "roll", 0, 4)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	all := watchN(t, ctx, s, "", 3, 3)
	if all[0].Revision != 4 || all[1] != (Event{Revision: 5, Op: OpDelete, Name: "other"}) {
		t.Errorf("watch from 3 = %+v", all)
	}
	// A watch from now sees only what comes next.
	done := make(chan []Event)
	go func() { done <- watchN(t, ctx, s, "", FromNow, 1) }()
	for {
		if _, err := s.Append(ctx, "late", itemTD(t, 5, 1)); err != nil {
			t.Fatal(err) // ctx's limit included
		}
		select {
		case evs := <-done:
			if evs[0].Name != "late" || evs[0].Revision < 7 {
				t.Fatalf("watch from now = %+v", evs)
			}
			return
		default:
		}
	}
}

func TestStore_WatchCompacted(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{History: 5})
	for i := range 20 {
		s.Append(ctx, "b", itemTD(t, int64(i), 1))
	}
	for _, err := range s.Watch(ctx, "", 1) {
		if !errors.Is(err, ErrCompacted) {
			t.Fatalf("watch from 1 after 20 events with History 5 = %v, want ErrCompacted", err)
		}
		break
	}
	evs := watchN(t, ctx, s, "", 15, 5)
	if evs[0].Revision != 16 || evs[4].Revision != 20 {
		t.Fatalf("watch from 15 = %+v", evs)
	}
	for _, err := range s.Watch(ctx, "", 99) {
		if !errors.Is(err, ErrCompacted) {
			t.Fatalf("watch from a revision the store never reached = %v, want ErrCompacted", err)
		}
		break
	}
}
