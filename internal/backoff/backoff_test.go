package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoff_Bounds(t *testing.T) {
	b := Backoff{Base: 10 * time.Millisecond, Max: time.Second, Rand: rand.New(rand.NewPCG(1, 2))}
	wantBounds := []time.Duration{10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000}
	for i, want := range wantBounds {
		want *= time.Millisecond
		if got := b.Bound(); got != want {
			t.Fatalf("wait %d: bound %v, want %v", i, got, want)
		}
		if d := b.Next(); d < 0 || d >= want {
			t.Fatalf("wait %d: %v, outside [0, %v)", i, d, want)
		}
	}
	b.Reset()
	if got := b.Bound(); got != 10*time.Millisecond {
		t.Errorf("after Reset: bound %v, want 10ms", got)
	}
}

// TestBackoff_FullJitter: the waits spread over their whole range, so that
// clients that failed together do not retry together: draws from the
// same bound fall in every tenth of it, and their mean is near half the
// bound.
func TestBackoff_FullJitter(t *testing.T) {
	const n = 10000
	rng := rand.New(rand.NewPCG(3, 4))
	var deciles [10]int
	var sum time.Duration
	for range n {
		b := Backoff{Base: time.Second, Max: time.Second, Rand: rng}
		d := b.Next()
		deciles[d*10/time.Second]++
		sum += d
	}
	for i, c := range deciles {
		if c < n/10/2 { // expected n/10 each; half of it is far out of chance
			t.Errorf("decile %d holds %d of %d draws", i, c, n)
		}
	}
	if mean := sum / n; mean < 450*time.Millisecond || mean > 550*time.Millisecond {
		t.Errorf("mean wait %v, want about 500ms", mean)
	}
}

func TestBackoff_NoOverflow(t *testing.T) {
	b := Backoff{Base: time.Duration(1) << 61, Max: time.Duration(1<<63 - 1)}
	for i := range 100 {
		if bound := b.Bound(); i >= 2 && bound != b.Max {
			t.Fatalf("wait %d: bound %v, want Max", i, bound)
		}
		if d := b.Next(); d < 0 {
			t.Fatalf("negative wait %v", d)
		}
	}
	var zero Backoff
	if d := zero.Next(); d != 0 {
		t.Errorf("the zero Backoff waits %v", d)
	}
}

func TestBackoff_WaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := Backoff{Base: time.Hour, Max: time.Hour}
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait on an ended context: %v", err)
	}
	if err := (&Backoff{}).Wait(context.Background()); err != nil {
		t.Errorf("Wait of 0: %v", err)
	}
}
