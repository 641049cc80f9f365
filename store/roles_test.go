package store

import (
	"errors"
	"slices"
	"testing"
)

func TestTrainerWorker_VersionFilter(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{})
	for _, filter := range []bool{true, false} {
		c := dialT(t, n.addr, "st", root, "ref")
		tr, err := NewTrainer(c, FilterVersion(filter), RolloutsBin("data"))
		if err != nil {
			t.Fatal(err)
		}
		w, _ := NewWorker(c)
		if _, err := w.Params(ctx); !errors.Is(err, ErrNotFound) && filter {
			t.Fatalf("Params before any publication = %v, want ErrNotFound", err)
		}
		v1, _ := tr.Publish(ctx, itemTD(t, 100, 10))
		p, err := w.WaitNewer(ctx)
		if err != nil || p.Version != v1 {
			t.Fatalf("WaitNewer = %+v, %v", p, err)
		}
		p.Close()
		w.AddRollout(ctx, itemTD(t, 1, 4)) // made with v1
		v2, _ := tr.Publish(ctx, itemTD(t, 200, 10))
		w.AddRollout(ctx, itemTD(t, 2, 4)) // still v1: the worker has not read v2
		p, _ = w.Params(ctx)
		p.Close()
		w.AddRollout(ctx, itemTD(t, 3, 4)) // v2
		rs, err := tr.Rollouts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, r := range rs {
			got = append(got, idOf(t, r.TD))
			if r.Version != v1 && r.Version != v2 {
				t.Errorf("rollout version %d", r.Version)
			}
			r.Close()
		}
		want := []int64{3}
		if !filter {
			want = []int64{1, 2, 3}
		}
		if !slices.Equal(got, want) || (filter && tr.Dropped() != 2) {
			t.Fatalf("filter %v: rollouts %v (dropped %d), want %v", filter, got, tr.Dropped(), want)
		}
		c.Delete(ctx, "data")
	}
}

func TestTrainer_SkipsItemsThatAreNotRollouts(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{})
	tr, _ := NewTrainer(s, FilterVersion(false))
	w, _ := NewWorker(s)
	w.AddRollout(ctx, itemTD(t, 1, 4))
	s.Append(ctx, "data", itemTD(t, 2, 4)) // not a rollout
	rs, err := tr.Rollouts(ctx)
	if !errors.Is(err, ErrFormat) || len(rs) != 1 || idOf(t, rs[0].TD) != 1 {
		t.Fatalf("Rollouts = %d, %v", len(rs), err)
	}
	if _, err := NewTrainer(s, ParamsName("a/b")); !errors.Is(err, ErrName) {
		t.Fatalf("NewTrainer with a bad name = %v", err)
	}
}
