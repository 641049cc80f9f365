package loader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// dialViews joins the fixture's producer with Options.Views.
func (f *fixture) dialViews(t testing.TB, opts Options) *Consumer {
	t.Helper()
	opts.Views = true
	if opts.Root == "" && !opts.Bytes {
		opts.Root = f.root
	}
	c, err := Dial(context.Background(), f.addr, "train", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestConsumer_ViewsExactlyOnce: with views, every sample of an epoch
// comes once, in the producer's order, whatever the batch size (views of
// a slot, copies across two, the short last batch), by reference and as
// bytes.
func TestConsumer_ViewsExactlyOnce(t *testing.T) {
	const n, seed = 100, 5
	f := newFixture(t, n, Config{Batch: 16, Slots: 4, Seed: seed, IndexKey: "index"})
	for _, bytes := range []bool{false, true} {
		for _, b := range []int{1, 7, 16, 40, 64} {
			t.Run(fmt.Sprintf("bytes=%v/batch=%d", bytes, b), func(t *testing.T) {
				c := f.dialViews(t, Options{Batch: b, Bytes: bytes})
				if c.SharedFS() == bytes {
					t.Fatalf("SharedFS = %v with bytes=%v", c.SharedFS(), bytes)
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
	t.Run("droplast", func(t *testing.T) {
		c := f.dialViews(t, Options{Batch: 7, DropLast: true})
		e := c.Epoch()
		ids, sizes, err := consumerEpoch(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if want := wantOrder(n, seed, e)[:n/7*7]; !slices.Equal(ids, want) || len(sizes) != n/7 || c.Len() != n/7 {
			t.Errorf("got %d samples in %d batches (Len %d), want the first %d of the order in %d", len(ids), len(sizes), c.Len(), len(want), n/7)
		}
	})
}

// firstView iterates c's next epoch in a goroutine and hands its first
// batch to the caller, holding the loop's body until hold is closed; the
// loop's next item (nil at a clean epoch end) comes on the returned
// channel, after which the loop breaks.
func firstView(c *Consumer, hold <-chan struct{}) (<-chan *tensordict.TensorDict, <-chan error) {
	first := make(chan *tensordict.TensorDict, 1)
	next := make(chan error, 1)
	go func() {
		i := 0
		for b, err := range c.Batches(context.Background()) {
			if i == 1 || err != nil {
				next <- err
				return
			}
			first <- b
			<-hold
			i++
		}
		next <- nil
	}()
	return first, next
}

// TestConsumer_ViewIsNotOverwrittenWhileHeld: a consumer holding a view
// (its loop's body has not returned) holds the slot: on a ring of two
// slots, another consumer's epoch waits for it, and the view's bytes are
// the batch's until the body returns; then both go on.
func TestConsumer_ViewIsNotOverwrittenWhileHeld(t *testing.T) {
	const b, n, seed = 10, 100, 1
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Window: 2, Seed: seed})
	held := f.dialViews(t, Options{Batch: b})
	other := f.dial(t, b, false)
	hold := make(chan struct{})
	e := held.Epoch()
	first, next := firstView(held, hold)
	view := <-first
	snap, err := view.Clone()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var otherIDs, otherSizes []int
	go func() {
		var err error
		otherIDs, otherSizes, err = consumerEpoch(context.Background(), other)
		done <- err
	}()
	// The other consumer gets the two batches in the ring, then the
	// producer waits for the held slot (and would rewrite it otherwise).
	waitFor(t, "the producer to wait for the held slot", func() bool {
		st := f.p.Stats()
		return st.Published > 2 || (st.Published == 2 && st.WaitNS > int64(50*time.Millisecond))
	})
	if st := f.p.Stats(); st.Published != 2 || st.DroppedSlow != 0 {
		t.Fatalf("stats %+v: want 2 batches published while the view is held", st)
	}
	if !viewEqual(t, view, snap) {
		t.Fatal("the held view changed")
	}
	if ids, err := sampleIDs(view); err != nil || !slices.Equal(ids, wantOrder(n, seed, e)[:b]) {
		t.Fatalf("the held view holds %v (%v), want the epoch's first batch", ids, err)
	}
	close(hold)
	if err := <-next; err != nil {
		t.Fatalf("the held consumer's next batch: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := checkEpoch(otherIDs, otherSizes, n, seed, e, b); err != nil {
		t.Error(err)
	}
}

// TestConsumer_ViewsCopyBatchesLargerThanTheRingHolds: with views, a
// batch that is copied frees each producer batch once its rows are
// copied, as without views: a batch of 30 spanning three producer batches
// of 16 on a ring of two (Dial allows up to 2 × 16) is served, by
// reference and by bytes. It failed before the fix: the copied pieces held
// their slots until the loop was done with the batch, the producer waited
// for a slot the unfinished batch held, and after MaxWait dropped the
// consumer.
func TestConsumer_ViewsCopyBatchesLargerThanTheRingHolds(t *testing.T) {
	const n, seed, b = 96, 3, 30
	f := newFixture(t, n, Config{Batch: 16, Slots: 2, Window: 2, Seed: seed, MaxWait: time.Second})
	for _, bytes := range []bool{false, true} {
		t.Run(fmt.Sprintf("bytes=%v", bytes), func(t *testing.T) {
			c := f.dialViews(t, Options{Batch: b, Bytes: bytes})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			e := c.Epoch()
			ids, sizes, err := consumerEpoch(ctx, c)
			if err != nil {
				t.Fatalf("epoch %d: %v (after %d samples; stats %+v)", e, err, len(ids), f.p.Stats())
			}
			if err := checkEpoch(ids, sizes, n, seed, e, b); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestConsumer_ViewHeldWhileLaterBatchesAreCopied: a batch copied after a
// view that the loop still reads does not release the view's slot: a
// consumer of batch 8 on producer batches of 10 gets rows 0-7 as a view,
// and copies rows 8-15 out of the same slot and the next while its body
// holds the view; on a ring of two slots the producer waits, the view's
// bytes do not change, and both consumers go on once the body returns.
// (Copies release their slots as they are copied since the fix that
// TestConsumer_ViewsCopyBatchesLargerThanTheRingHolds checks; this one
// checks that they never release past a view.)
func TestConsumer_ViewHeldWhileLaterBatchesAreCopied(t *testing.T) {
	const b, n, seed = 8, 100, 1
	f := newFixture(t, n, Config{Batch: 10, Slots: 2, Window: 2, Seed: seed})
	held := f.dialViews(t, Options{Batch: b, Prefetch: 2})
	other := f.dial(t, 10, false)
	hold := make(chan struct{})
	e := held.Epoch()
	first, next := firstView(held, hold)
	view := <-first
	snap, err := view.Clone()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var otherIDs, otherSizes []int
	go func() {
		var err error
		otherIDs, otherSizes, err = consumerEpoch(context.Background(), other)
		done <- err
	}()
	waitFor(t, "the producer to wait for the held slot", func() bool {
		st := f.p.Stats()
		return st.Published > 2 || (st.Published == 2 && st.WaitNS > int64(50*time.Millisecond))
	})
	if st := f.p.Stats(); st.Published != 2 || st.DroppedSlow != 0 {
		t.Fatalf("stats %+v: want 2 batches published while the view is held", st)
	}
	if !viewEqual(t, view, snap) {
		t.Fatal("the held view changed")
	}
	close(hold)
	if err := <-next; err != nil {
		t.Fatalf("the held consumer's next batch: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := checkEpoch(otherIDs, otherSizes, n, seed, e, 10); err != nil {
		t.Error(err)
	}
}

// TestConsumer_ViewOverwrittenIsErrDropped: a consumer that holds a view
// past MaxWait is dropped and its slot rewritten for the others; when its
// loop's body returns, the next item is ErrDropped, never the next batch
// as if nothing had happened.
func TestConsumer_ViewOverwrittenIsErrDropped(t *testing.T) {
	const b, n, seed = 10, 100, 1
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Window: 2, Seed: seed, MaxWait: 100 * time.Millisecond})
	held := f.dialViews(t, Options{Batch: b})
	other := f.dial(t, b, false)
	hold := make(chan struct{})
	e := held.Epoch()
	first, next := firstView(held, hold)
	<-first
	ids, sizes, err := consumerEpoch(context.Background(), other)
	if err == nil {
		err = checkEpoch(ids, sizes, n, seed, e, b)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := f.p.Stats(); st.DroppedSlow != 1 || st.Published < 3 {
		t.Fatalf("stats %+v: want the holder dropped and its slot rewritten", st)
	}
	close(hold)
	if err := <-next; !errors.Is(err, ErrDropped) {
		t.Fatalf("after its view was rewritten, the loop's next item: %v, want ErrDropped", err)
	}
}

// TestConsumer_ViewOutlivesClose: Close called from another goroutine
// while the loop's body reads a view leaves the mapping until the body
// returns; a batch assembled ahead may still come, whole, and the loop
// then ends with an error.
func TestConsumer_ViewOutlivesClose(t *testing.T) {
	const b, n, seed = 10, 100, 1
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Seed: seed})
	c := f.dialViews(t, Options{Batch: b})
	e := c.Epoch()
	want := wantOrder(n, seed, e)
	i := 0
	var last error
	for batch, err := range c.Batches(context.Background()) {
		if err != nil {
			last = err
			break
		}
		if i == 0 {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if ids, err := sampleIDs(batch); err != nil || !slices.Equal(ids, want[i*b:(i+1)*b]) {
			t.Fatalf("batch %d after Close holds %v (%v), want %v", i, ids, err, want[i*b:(i+1)*b])
		}
		i++
		if i > 3 {
			t.Fatalf("the loop went on for %d batches after Close", i-1)
		}
	}
	if last == nil {
		t.Fatal("the loop ended without an error after Close")
	}
}

// viewEqual reports whether a and b hold the same bytes.
func viewEqual(t *testing.T, a, b *tensordict.TensorDict) bool {
	t.Helper()
	for path, ta := range a.Leaves() {
		tb, err := b.Tensor(path...)
		if err != nil {
			t.Fatal(err)
		}
		ba, _ := ta.Bytes()
		bb, _ := tb.Bytes()
		if !slices.Equal(ba, bb) {
			return false
		}
	}
	return true
}
