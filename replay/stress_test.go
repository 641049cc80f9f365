package replay

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStress_OverwrittenRowsAreNeverReturnedTorn has writers overwrite a
// small buffer of large rows as fast as they can while samplers sample it:
// every row sampled must be whole, and the generation guard must have
// caught rows overwritten mid-copy (or the test proved nothing).
func TestStress_OverwrittenRowsAreNeverReturnedTorn(t *testing.T) {
	const (
		capacity = 61 // not a divisor of 256, so ids sharing a slot differ in obs
		side     = 128
		writers  = 2
		samplers = 2
	)
	b := create(t, Config{Capacity: capacity})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.Extend(ctx, transitionsSized(t, side, seq(0, capacity)...)); err != nil {
		t.Fatal(err)
	}
	var next atomic.Int64
	next.Store(capacity)
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, writers+samplers)
	for range writers {
		wg.Go(func() {
			for !stop.Load() {
				id := int(next.Add(4)) - 4
				if _, err := b.Extend(ctx, transitionsSized(t, side, id, id+1, id+2, id+3)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var sampled atomic.Int64
	for range samplers {
		wg.Go(func() {
			dst, err := b.Schema().Zeros(16)
			if err != nil {
				errs <- err
				return
			}
			for !stop.Load() {
				if _, err := b.SampleInto(ctx, dst); err != nil {
					errs <- err
					return
				}
				if _, err := checkRows(dst); err != nil {
					errs <- err
					return
				}
				sampled.Add(16)
			}
		})
	}
	// Run until the guard has fired a few times, at least 300 ms and at
	// most 30 s.
	start := time.Now()
	for time.Since(start) < 30*time.Second && (time.Since(start) < 300*time.Millisecond || stats(t, b).Resampled < 20) {
		time.Sleep(20 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := stats(t, b)
	t.Logf("%d written, %d rows sampled whole, %d resampled after being overwritten mid-copy",
		next.Load(), sampled.Load(), st.Resampled)
	if st.Resampled == 0 {
		t.Fatal("no row was overwritten while sampled: the test did not exercise the guard")
	}
}

// TestStress_LargeSamplesOfAFastRing samples batches nearly as large as
// the buffer while writers overwrite it: some rows of every batch are
// overwritten while copied, and only those may be sampled again. (Checking
// the whole batch again each round gave up with Aborted here.)
func TestStress_LargeSamplesOfAFastRing(t *testing.T) {
	const capacity, batch = 300, 256
	b := create(t, Config{Capacity: capacity})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := b.Extend(ctx, transitionsSized(t, 32, seq(0, capacity)...)); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				id := int(next.Add(16)) - 16
				if _, err := b.Extend(ctx, transitionsSized(t, 32, seq(id, id+16)...)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	dst, err := b.Schema().Zeros(batch)
	if err != nil {
		t.Fatal(err)
	}
	samples := 0
	for start := time.Now(); time.Since(start) < 500*time.Millisecond; samples++ {
		if _, err := b.SampleInto(ctx, dst); err != nil {
			t.Fatalf("sample %d: %v", samples, err)
		}
		if _, err := checkRows(dst); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d samples of %d, %d rows resampled, %d written", samples, batch, stats(t, b).Resampled, next.Load())
}
