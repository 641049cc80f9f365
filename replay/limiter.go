package replay

import "math"

// limiter is the arithmetic of a RateLimit, after Reverb's RateLimiter: the
// buffer asks it whether an insert or a sample may go ahead now and waits
// (on its own condition) while the answer is no. Counts are cumulative since
// the buffer was created and are saved in checkpoints.
//
// With spi = SamplesPerInsert, diff = inserts*spi - samples must stay within
// [minDiff, maxDiff] = spi*MinSize -/+ ErrorBuffer: an insert that would take
// diff above maxDiff waits for samples, a sample that would take it below
// minDiff waits for inserts. Inserts that keep the buffer at or below
// MinSize never wait, and no sample happens below MinSize.
type limiter struct {
	cfg              RateLimit
	minDiff, maxDiff float64
	inserts, samples int64 // cumulative, committed inserts and returned samples
}

func newLimiter(cfg RateLimit) *limiter {
	l := &limiter{cfg: cfg, minDiff: math.Inf(-1), maxDiff: math.Inf(1)}
	if cfg.SamplesPerInsert > 0 {
		offset := cfg.SamplesPerInsert * float64(cfg.MinSize)
		l.minDiff, l.maxDiff = offset-cfg.ErrorBuffer, offset+cfg.ErrorBuffer
	}
	return l
}

// canInsert reports whether n more inserts may start, with pending inserts
// already started and size transitions held.
func (l *limiter) canInsert(n, pending, size int) bool {
	if size+pending+n <= l.cfg.MinSize {
		return true
	}
	diff := float64(l.inserts+int64(pending+n))*l.cfg.SamplesPerInsert - float64(l.samples)
	return diff <= l.maxDiff
}

// canSample reports whether n samples may be taken with size transitions
// held.
func (l *limiter) canSample(n, size int) bool {
	if size < l.cfg.MinSize {
		return false
	}
	diff := float64(l.inserts)*l.cfg.SamplesPerInsert - float64(l.samples+int64(n))
	return diff >= l.minDiff
}

func (l *limiter) inserted(n int) { l.inserts += int64(n) }
func (l *limiter) sampled(n int)  { l.samples += int64(n) }
