// Package backoff spaces out the retries of a failing call: exponential
// backoff with full jitter. The n-th wait (from 0) is drawn uniformly from
// [0, min(Max, Base·2^n)), so that many clients that failed together (a
// node restarting under its writers) spread their retries out instead of
// returning in lock-step (the "full jitter" of the AWS Architecture Blog's
// "Exponential Backoff And Jitter").
//
// A Backoff is a value: make one per retry loop.
//
//	b := backoff.Backoff{Base: 20 * time.Millisecond, Max: time.Second}
//	for {
//		err := call()
//		if !retryable(err) {
//			return err
//		}
//		if werr := b.Wait(ctx); werr != nil {
//			return werr
//		}
//	}
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the state of one retry loop. Its zero value is not useful:
// set Base and Max. It is not safe for concurrent use.
type Backoff struct {
	Base time.Duration // the first wait's bound; > 0
	Max  time.Duration // the largest bound; >= Base

	// Rand, when set, draws the waits (tests seed it); nil uses the
	// package's generator.
	Rand *rand.Rand

	attempt int // waits drawn so far
}

// Bound returns the bound of the next wait, min(Max, Base·2^n) for the
// n-th wait.
func (b *Backoff) Bound() time.Duration {
	bound := b.Base
	for i := 0; i < b.attempt && bound < b.Max; i++ {
		if bound > b.Max/2 {
			bound = b.Max // and no overflow
			break
		}
		bound *= 2
	}
	return max(min(bound, b.Max), 0)
}

// Next returns the next wait, uniform in [0, Bound()), and moves on.
func (b *Backoff) Next() time.Duration {
	bound := b.Bound()
	b.attempt++
	if bound <= 0 {
		return 0
	}
	if b.Rand != nil {
		return time.Duration(b.Rand.Int64N(int64(bound)))
	}
	return time.Duration(rand.Int64N(int64(bound)))
}

// Wait sleeps for Next() or until ctx ends, and returns ctx's error if it
// ended first.
func (b *Backoff) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reset starts the loop over: the next wait is bounded by Base again.
func (b *Backoff) Reset() { b.attempt = 0 }
