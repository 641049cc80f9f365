package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// shareOf returns the samples of rank's share of epoch, in order, as
// Options.Rank and Options.WorldSize split the producer's order (world 0:
// the whole epoch).
func shareOf(n int, seed uint64, epoch int64, rank, world int) []int {
	order := wantOrder(n, seed, epoch)
	if world <= 1 {
		return order
	}
	var out []int
	for _, p := range distributedSampler(n, rank, world) {
		out = append(out, order[p])
	}
	return out
}

// TestConsumer_ResumeSkipsTheShareYielded: a consumer given a State of the
// epoch it joins yields its share less the State's samples, in order,
// whatever the share (whole, a rank's with its padding), the transport
// and the batch size; a State of an earlier epoch leaves the epoch whole.
// State then counts the whole share.
func TestConsumer_ResumeSkipsTheShareYielded(t *testing.T) {
	const n, seed = 100, 7
	for _, tc := range []struct {
		name               string
		rank, world, batch int
		skip               int
		bytes, views       bool
		earlier            bool // the State is of the epoch before the one joined
	}{
		{name: "nothing skipped", batch: 16},
		{name: "within a producer batch", batch: 16, skip: 7},
		{name: "producer batches whole", batch: 10, skip: 37},
		{name: "by bytes", batch: 9, skip: 37, bytes: true},
		{name: "with views", batch: 16, skip: 32, views: true},
		{name: "the whole epoch", batch: 16, skip: n},
		{name: "an earlier epoch's state", batch: 16, skip: 40, earlier: true},
		{name: "a rank's share", rank: 1, world: 3, batch: 5, skip: 11},
		{name: "a rank's share by bytes", rank: 2, world: 3, batch: 4, skip: 20, bytes: true},
		{name: "up to the padding", rank: 1, world: 3, batch: 5, skip: 33},
		{name: "a rank's share whole", rank: 1, world: 3, batch: 5, skip: 34},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, n, Config{Batch: 16, Slots: 4, Seed: seed, IndexKey: "index"})
			opts := Options{Batch: tc.batch, Root: f.root, Rank: tc.rank, WorldSize: tc.world, Views: tc.views}
			if tc.bytes {
				opts.Root = ""
			}
			c, err := Dial(context.Background(), f.addr, "train", opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			e := c.Epoch()
			st := State{Epoch: e, Samples: tc.skip}
			if tc.earlier {
				st.Epoch = e - 1
			}
			if err := c.Resume(st); err != nil {
				t.Fatal(err)
			}
			ids, _, err := consumerEpoch(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			share := shareOf(n, seed, e, tc.rank, tc.world)
			want := share[min(tc.skip, len(share)):]
			if tc.earlier {
				want = share
			}
			if !slices.Equal(ids, want) {
				t.Errorf("epoch %d resumed at %+v: got %d samples %v, want %d: %v", e, st, len(ids), ids, len(want), want)
			}
			if got, want := c.State(), (State{Epoch: e, Samples: len(share), Rank: tc.rank, WorldSize: max(tc.world, 1)}); got != want {
				t.Errorf("State after the epoch: %+v, want %+v", got, want)
			}
			// The next epoch is whole: Resume is forgotten.
			ids, _, err = consumerEpoch(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			if want := shareOf(n, seed, e+1, tc.rank, tc.world); !slices.Equal(ids, want) {
				t.Errorf("epoch %d after the resumed one: %d samples, want %d", e+1, len(ids), len(want))
			}
		})
	}
}

// TestConsumer_ResumeWithViewsSkipsMoreThanTheRing: with views, a State
// whose samples span more producer batches than the ring holds (80 of
// 100, five batches of 16 on a ring of four) resumes, by reference and by
// bytes: the batches skipped whole are released as they pass. It failed
// before the fix: with views only a yielded item released, a batch
// skipped whole made none, so the producer waited for the first skipped
// slot and dropped the consumer after MaxWait.
func TestConsumer_ResumeWithViewsSkipsMoreThanTheRing(t *testing.T) {
	const n, seed, skip = 100, 7, 80
	f := newFixture(t, n, Config{Batch: 16, Slots: 4, Seed: seed, IndexKey: "index", MaxWait: time.Second})
	for _, bytes := range []bool{false, true} {
		t.Run(fmt.Sprintf("bytes=%v", bytes), func(t *testing.T) {
			c := f.dialViews(t, Options{Batch: 16, Bytes: bytes})
			e := c.Epoch()
			if err := c.Resume(State{Epoch: e, Samples: skip}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ids, _, err := consumerEpoch(ctx, c)
			if err != nil {
				t.Fatalf("epoch %d resumed at %d samples: %v (stats %+v)", e, skip, err, f.p.Stats())
			}
			if want := wantOrder(n, seed, e)[skip:]; !slices.Equal(ids, want) {
				t.Errorf("got %v, want %v", ids, want)
			}
		})
	}
}

// TestConsumer_ResumeInTheRestartedJob is the use: a rank's consumer stops
// after two batches (its job killed), and the consumer of the restarted
// job, given the State it had saved (through JSON, as a checkpoint keeps
// it), joins the same epoch while its window is open and yields the rest
// of the share: the two together see the share once, in order. Another
// consumer holding a view of the epoch's first batch keeps the window
// open, as a running job would.
func TestConsumer_ResumeInTheRestartedJob(t *testing.T) {
	const n, seed = 100, 3
	f := newFixture(t, n, Config{Batch: 4, Slots: 8, Window: 8, Seed: seed, IndexKey: "index"})
	keeper, err := Dial(context.Background(), f.addr, "train", Options{Batch: 4, Root: f.root, Views: true})
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Close()
	next, stop := iter.Pull2(keeper.Batches(context.Background()))
	defer stop()
	if _, err, ok := next(); !ok || err != nil {
		t.Fatalf("the keeper's first batch: %v (%v)", err, ok)
	}

	opts := Options{Batch: 3, Root: f.root, Rank: 1, WorldSize: 2}
	a, err := Dial(context.Background(), f.addr, "train", opts)
	if err != nil {
		t.Fatal(err)
	}
	var first []int
	var saved []byte
	for b, err := range a.Batches(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, mustIDs(t, b)...)
		if len(first) == 6 {
			if saved, err = json.Marshal(a.State()); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	a.Close()
	if want := `{"epoch":` + itoa64(a.State().Epoch) + `,"samples":6,"rank":1,"world_size":2}`; string(saved) != want {
		t.Fatalf("the saved State %s, want %s (the Python client's state_dict)", saved, want)
	}

	b, err := Dial(context.Background(), f.addr, "train", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var st State
	if err := json.Unmarshal(saved, &st); err != nil {
		t.Fatal(err)
	}
	if b.Epoch() != st.Epoch {
		t.Fatalf("the restarted consumer joined epoch %d, want %d (its window held open)", b.Epoch(), st.Epoch)
	}
	if err := b.Resume(st); err != nil {
		t.Fatal(err)
	}
	stop() // the keeper lets the epoch go on
	keeper.Close()
	rest, _, err := consumerEpoch(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := append(first, rest...), shareOf(n, seed, st.Epoch, 1, 2); !slices.Equal(got, want) {
		t.Errorf("before and after the restart: %d samples %v, want the share once, %d: %v", len(got), got, len(want), want)
	}
}

func mustIDs(t *testing.T, b *tensordict.TensorDict) []int {
	t.Helper()
	ids, err := sampleIDs(b)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func itoa64(v int64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestConsumer_ResumeRefusesAnotherShare: a State saved by another rank
// (or for another world size) is ErrArgument, and the consumer then
// yields its share whole: skipping another share's count would silently
// drop samples of its own. A State without rank and world size (JSON
// {"epoch", "samples"} only) is taken as it is.
func TestConsumer_ResumeRefusesAnotherShare(t *testing.T) {
	const n, seed = 40, 5
	f := newFixture(t, n, Config{Batch: 4, Slots: 4, Seed: seed, IndexKey: "index"})
	c, err := Dial(context.Background(), f.addr, "train", Options{Batch: 4, Root: f.root, Rank: 1, WorldSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := c.Epoch()
	for _, bad := range []State{
		{Epoch: e, Samples: 8, Rank: 0, WorldSize: 2},
		{Epoch: e, Samples: 8, Rank: 1, WorldSize: 4},
		{Epoch: e, Samples: 8, Rank: 0, WorldSize: 1},
		{Epoch: e, Samples: -1, Rank: 1, WorldSize: 2},
	} {
		if err := c.Resume(bad); !errors.Is(err, ErrArgument) {
			t.Errorf("Resume(%+v) = %v, want ErrArgument", bad, err)
		}
	}
	ids, _, err := consumerEpoch(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if want := shareOf(n, seed, e, 1, 2); !slices.Equal(ids, want) {
		t.Fatalf("after refused Resumes: %v, want the whole share %v", ids, want)
	}

	var old State
	if err := json.Unmarshal([]byte(`{"epoch":`+itoa64(e+1)+`,"samples":4}`), &old); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(old); err != nil {
		t.Fatalf("Resume of a State without rank and world size: %v", err)
	}
	ids, _, err = consumerEpoch(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if want := shareOf(n, seed, e+1, 1, 2)[4:]; !slices.Equal(ids, want) {
		t.Fatalf("resumed from %+v: %v, want %v", old, ids, want)
	}
}
