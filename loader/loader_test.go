package loader

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

func TestLocal_EpochsInOrder(t *testing.T) {
	root := t.TempDir()
	makeDataset(t, root+"/data", 50)
	l, err := NewLocal(Config{Dataset: root + "/data", Seed: 9, IndexKey: "index"}, Options{Batch: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Len() != 8 {
		t.Errorf("Len = %d, want 8", l.Len())
	}
	var prev []int
	for e := range int64(3) {
		ids, sizes, err := epochIDs(context.Background(), l.Batches)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkEpoch(ids, sizes, 50, 9, e, 7); err != nil {
			t.Error(err)
		}
		if fmt.Sprint(ids) == fmt.Sprint(prev) {
			t.Errorf("epoch %d has the order of the one before", e)
		}
		prev = ids
	}
}

func TestConsumer_ExactlyOncePerEpoch(t *testing.T) {
	const n, seed = 100, 5
	f := newFixture(t, n, Config{Batch: 16, Slots: 4, Seed: seed, IndexKey: "index"})
	for _, bytes := range []bool{false, true} {
		for _, b := range []int{1, 7, 16, 40, 64} {
			t.Run(fmt.Sprintf("bytes=%v/batch=%d", bytes, b), func(t *testing.T) {
				c := f.dial(t, b, bytes)
				if c.Len() != (n+b-1)/b {
					t.Errorf("Len = %d, want %d", c.Len(), (n+b-1)/b)
				}
				for range 2 {
					e := c.Epoch()
					ids, sizes, err := consumerEpoch(context.Background(), c)
					if err != nil {
						t.Fatal(err)
					}
					if err := checkEpoch(ids, sizes, n, seed, e, b); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
}

func TestConsumer_MixedBatchSizesTogether(t *testing.T) {
	const n, seed = 1000, 3
	f := newFixture(t, n, Config{Batch: 64, Slots: 4, Seed: seed})
	var wg sync.WaitGroup
	cs := []*Consumer{f.dial(t, 32, false), f.dial(t, 64, true), f.dial(t, 128, false)}
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close() // a consumer that stays joined without iterating holds the others up
			for range 3 {
				e := c.Epoch()
				ids, sizes, err := consumerEpoch(context.Background(), c)
				if err == nil {
					err = checkEpoch(ids, sizes, n, seed, e, c.o.Batch)
				}
				if err != nil {
					t.Errorf("batch %d: %v", c.o.Batch, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if st := f.p.Stats(); st.Left != 3 || st.Dropped+st.DroppedSlow != 0 || st.Consumers != 0 {
		t.Errorf("stats %+v: want the three consumers closed counted as left, none dropped", st)
	}
}
