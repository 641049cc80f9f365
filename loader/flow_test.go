package loader

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestProducer_LateJoiners: with the ring holding epoch 1's first batch
// and the producer blocked on its second (the first consumer has read
// nothing), a consumer joining gets epoch 1 whole, batch 0 included, if
// the window (2 batches) is still open, and starts at epoch 2 if it (1
// batch) is closed.
func TestProducer_LateJoiners(t *testing.T) {
	const b, n, seed = 10, 30, 4 // 3 batches an epoch
	for _, tc := range []struct {
		window    int
		wantEpoch int64
	}{{2, 1}, {1, 2}} {
		t.Run(fmt.Sprintf("window=%d", tc.window), func(t *testing.T) {
			f := newFixture(t, n, Config{Batch: b, Slots: 4, Window: tc.window, Seed: seed})
			first := f.dial(t, b, false)
			waitFor(t, "the producer blocked on epoch 1's second batch", func() bool {
				st := f.p.Stats()
				return st.Epoch == 1 && st.InEpoch == 1 && st.WaitNS > 0
			})
			if st := f.p.Stats(); st.Window != (tc.window == 2) {
				t.Fatalf("window open = %v with a window of %d", st.Window, tc.window)
			}
			late := f.dial(t, b, true)
			if got := late.Epoch(); got != tc.wantEpoch {
				t.Fatalf("the late consumer starts at epoch %d, want %d", got, tc.wantEpoch)
			}
			ctx := context.Background()
			done := make(chan error, 1)
			go func() {
				for range 3 {
					e := first.Epoch()
					ids, sizes, err := consumerEpoch(ctx, first)
					if err == nil {
						err = checkEpoch(ids, sizes, n, seed, e, b)
					}
					if err != nil {
						done <- fmt.Errorf("first consumer: %w", err)
						return
					}
				}
				done <- nil
			}()
			ids, sizes, err := consumerEpoch(ctx, late)
			if err == nil {
				err = checkEpoch(ids, sizes, n, seed, tc.wantEpoch, b)
			}
			if err != nil {
				t.Errorf("late consumer: %v", err)
			}
			late.Close()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}

// TestProducer_DropsConsumerThatNeverAcks: a consumer that heartbeats but
// never reads holds the producer up for MaxWait, is dropped, and the other
// goes on; the dropped one is told so, then joins again.
func TestProducer_DropsConsumerThatNeverAcks(t *testing.T) {
	const b, n, seed = 10, 100, 1
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Window: -1, Seed: seed, MaxWait: 300 * time.Millisecond})
	idle := f.dial(t, b, false)
	busy := f.dial(t, b, false)
	for range 2 {
		e := busy.Epoch()
		ids, sizes, err := consumerEpoch(context.Background(), busy)
		if err == nil {
			err = checkEpoch(ids, sizes, n, seed, e, b)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := f.p.Stats(); st.DroppedSlow != 1 || st.Consumers != 1 {
		t.Errorf("stats %+v: want 1 consumer dropped for holding a slot, 1 left", st)
	}
	var got error
	for _, err := range idle.Batches(context.Background()) {
		got = err
		break
	}
	if !errors.Is(got, ErrDropped) || !errors.Is(got, rpc.ErrAborted) {
		t.Errorf("the dropped consumer's next batch: %v, want ErrDropped", got)
	}
	busy.Close()
	e := idle.Epoch()
	ids, sizes, err := consumerEpoch(context.Background(), idle)
	if err != nil {
		t.Fatalf("after joining again: %v", err)
	}
	if e2 := idle.Epoch() - 1; e2 < e {
		t.Errorf("joined again at epoch %d, before %d", e2, e)
	} else if err := checkEpoch(ids, sizes, n, seed, e2, b); err != nil {
		t.Error(err)
	}
}

// TestProducer_DropsSilentConsumer: a consumer that joins and then says
// nothing (its process frozen, say) is dropped after Heartbeat; the
// others never wait for it longer.
func TestProducer_DropsSilentConsumer(t *testing.T) {
	const b, n, seed = 10, 100, 1
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Seed: seed, Heartbeat: 200 * time.Millisecond})
	rc, err := rpc.Dial(context.Background(), f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rpc.Call[joinResponse](context.Background(), rc, MethodJoin, joinRequest{Name: "train", Batch: b}); err != nil {
		t.Fatal(err)
	}
	c := f.dial(t, b, false)
	for range 2 {
		e := c.Epoch()
		ids, sizes, err := consumerEpoch(context.Background(), c)
		if err == nil {
			err = checkEpoch(ids, sizes, n, seed, e, b)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := f.p.Stats(); st.Dropped != 1 {
		t.Errorf("stats %+v: want the silent consumer dropped", st)
	}
}

// TestConsumer_BreakGivesUpTheEpoch: a loop that breaks gives up the rest
// of its epoch; the next Batches iterates the next epoch whole. Nobody
// else takes part in the epoch given up, so the producer cuts it short.
func TestConsumer_BreakGivesUpTheEpoch(t *testing.T) {
	const b, n, seed = 10, 100, 2
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Seed: seed})
	c := f.dial(t, b, false)
	e := c.Epoch()
	k := 0
	for _, err := range c.Batches(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		if k++; k == 3 {
			break
		}
	}
	if c.Epoch() != e+1 {
		t.Fatalf("after a break in epoch %d, Epoch = %d", e, c.Epoch())
	}
	ids, sizes, err := consumerEpoch(context.Background(), c)
	if err == nil {
		err = checkEpoch(ids, sizes, n, seed, e+1, b)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := f.p.Stats(); st.DroppedSlow+st.Dropped != 0 || st.CutShort != 1 {
		t.Errorf("stats %+v: want nobody dropped, one epoch cut short", st)
	}
}

// TestProducer_ResumesAtTheNextEpoch: a producer made again for a folder,
// with the same dataset and seed, begins after the last epoch the one
// before began; with another seed, at epoch 0.
func TestProducer_ResumesAtTheNextEpoch(t *testing.T) {
	const b, n, seed = 10, 30, 8
	f := newFixture(t, n, Config{Batch: b, Seed: seed})
	c := f.dial(t, b, false)
	for range 2 {
		if _, _, err := consumerEpoch(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	last := f.p.Stats().Epoch
	f.srv.Close()
	if err := f.p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		seed uint64
		want int64
	}{{seed, last + 1}, {seed + 1, 0}} {
		p, err := NewProducer(Config{Dataset: f.dataset, Dir: f.p.cfg.Dir, Batch: b, Seed: tc.seed})
		if err != nil {
			t.Fatal(err)
		}
		f.p = p
		f.serve(t)
		c := f.dial(t, b, false)
		if c.Epoch() != tc.want {
			t.Errorf("seed %d: the restarted producer serves epoch %d first, want %d", tc.seed, c.Epoch(), tc.want)
		}
		ids, sizes, err := consumerEpoch(context.Background(), c)
		if err == nil {
			err = checkEpoch(ids, sizes, n, tc.seed, tc.want, b)
		}
		if err != nil {
			t.Error(err)
		}
		c.Close()
		f.srv.Close()
		p.Close()
	}
	f.serve(t) // for the fixture's cleanup
}
