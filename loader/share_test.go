package loader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// distributedSampler returns the epoch positions of rank's share, as
// torch.utils.data.DistributedSampler(shuffle=False, drop_last=False)
// computes them over n samples: range(n) padded to a multiple of world
// with itself, repeated as needed, then every world-th from rank.
func distributedSampler(n, rank, world int) []int {
	total := (n + world - 1) / world * world
	idx := make([]int, 0, total)
	for len(idx) < total {
		for i := 0; i < n && len(idx) < total; i++ {
			idx = append(idx, i)
		}
	}
	var out []int
	for p := rank; p < total; p += world {
		out = append(out, idx[p])
	}
	return out
}

// TestShare_IsDistributedSamplers: a share's own rows of the epoch's
// batches, then its padding, are DistributedSampler's positions, for
// epochs smaller than the world too.
func TestShare_IsDistributedSamplers(t *testing.T) {
	for _, n := range []int{1, 2, 5, 16, 100, 101} {
		for _, world := range []int{2, 3, 4, 7} {
			for rank := range world {
				sh := newShare(rank, world, n)
				var got []int
				for first := 0; first < n; first += 16 {
					for _, o := range sh.own(nil, first, min(16, n-first)) {
						got = append(got, first+o)
					}
				}
				got = append(got, sh.pad...)
				if want := distributedSampler(n, rank, world); !slices.Equal(got, want) || len(got) != sh.samples() {
					t.Errorf("n %d, rank %d of %d: %v (%d samples), want %v", n, rank, world, got, sh.samples(), want)
				}
			}
		}
	}
}

// TestConsumer_RanksShareEachEpoch: consumers of rank 0, 1 and 2 of a
// world of 3 (one of them by bytes) each get DistributedSampler's share of
// every epoch of the producer's order, in batches of their own size, Len
// of them; together they see every sample of the epoch exactly once, but
// for the two of the padding (100 samples make shares of 34), which the
// ranks that end with them see once more.
func TestConsumer_RanksShareEachEpoch(t *testing.T) {
	const n, seed, world = 100, 5, 3
	f := newFixture(t, n, Config{Batch: 16, Slots: 4, Window: 4, Seed: seed, IndexKey: "index"})
	batches := []int{8, 5, 34}
	var cs []*Consumer
	for rank := range world {
		opts := Options{Batch: batches[rank], Root: f.root, Rank: rank, WorldSize: world}
		if rank == 1 {
			opts.Root = "" // by bytes
		}
		c, err := Dial(context.Background(), f.addr, "train", opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if want := (34 + batches[rank] - 1) / batches[rank]; c.Len() != want {
			t.Errorf("rank %d: Len %d, want %d", rank, c.Len(), want)
		}
		cs = append(cs, c)
	}
	const epochs = 2
	got := make([][][]int, world) // [rank][epoch]: the samples
	var wg sync.WaitGroup
	errs := make(chan error, world)
	for rank, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close() // done: a joined consumer that stops iterating holds the others up
			for range epochs {
				e := c.Epoch()
				ids, sizes, err := consumerEpoch(context.Background(), c)
				if err != nil {
					errs <- fmt.Errorf("rank %d, epoch %d: %w", rank, e, err)
					return
				}
				order := wantOrder(n, seed, e)
				var want []int
				for _, p := range distributedSampler(n, rank, world) {
					want = append(want, order[p])
				}
				if !slices.Equal(ids, want) {
					errs <- fmt.Errorf("rank %d, epoch %d: samples %v, want %v", rank, e, ids, want)
					return
				}
				if len(sizes) != c.Len() || slices.Max(sizes) > batches[rank] {
					errs <- fmt.Errorf("rank %d, epoch %d: batches of %v, want %d of at most %d", rank, e, sizes, c.Len(), batches[rank])
					return
				}
				got[rank] = append(got[rank], ids)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	for e := range epochs {
		seen := map[int]int{}
		for rank := range world {
			for _, id := range got[rank][e] {
				seen[id]++
			}
		}
		order := wantOrder(n, seed, int64(e))
		for pos, id := range order {
			want := 1
			if pos < 34*world-n { // the padding
				want = 2
			}
			if seen[id] != want {
				t.Errorf("epoch %d: sample %d (position %d) seen %d times by the ranks together, want %d", e, id, pos, seen[id], want)
			}
		}
	}
}

// TestDial_RefusesABadRank: a rank outside its world is ErrArgument at
// Dial, before anything is dialled; NewLocal refuses a world.
func TestDial_RefusesABadRank(t *testing.T) {
	for _, o := range []Options{{Rank: 3, WorldSize: 3}, {Rank: -1, WorldSize: 2}, {Rank: 1}, {WorldSize: -2}} {
		o.Batch = 4
		if _, err := Dial(context.Background(), "127.0.0.1:1", "train", o); !errors.Is(err, ErrArgument) {
			t.Errorf("Dial with rank %d of %d: %v, want ErrArgument", o.Rank, o.WorldSize, err)
		}
	}
	if _, err := NewLocal(Config{Dataset: "x", Dir: "y", Batch: 4}, Options{Batch: 4, Rank: 0, WorldSize: 2}); !errors.Is(err, ErrArgument) {
		t.Errorf("NewLocal with a world of 2: %v, want ErrArgument", err)
	}
}
