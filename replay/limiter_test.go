package replay

import "testing"

func TestLimiter(t *testing.T) {
	type step struct {
		op      string // "insert" or "sample"
		n       int
		allowed bool
	}
	for _, tc := range []struct {
		name  string
		cfg   RateLimit
		steps []step
	}{
		{"min size only", RateLimit{MinSize: 3}, []step{
			{"sample", 1, false}, {"insert", 2, true}, {"sample", 1, false},
			{"insert", 1, true}, {"sample", 1, true}, {"sample", 1000, true}, {"insert", 1000, true},
		}},
		// spi 1, slack 2, from MinSize 2: diff = inserts - samples stays in [0, 4].
		{"ratio", RateLimit{MinSize: 2, SamplesPerInsert: 1, ErrorBuffer: 2}, []step{
			{"insert", 2, true}, {"insert", 2, true}, {"insert", 1, false},
			{"sample", 4, true}, {"sample", 1, false}, {"insert", 3, true}, {"sample", 3, true},
		}},
		// Half a sample per insert: inserts run ahead of samples.
		{"fractional", RateLimit{MinSize: 1, SamplesPerInsert: 0.5, ErrorBuffer: 1}, []step{
			{"insert", 1, true}, {"insert", 2, true}, {"insert", 1, false},
			{"sample", 2, true}, {"sample", 1, false}, {"insert", 2, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(tc.cfg)
			size := 0
			for i, s := range tc.steps {
				var got bool
				switch s.op {
				case "insert":
					if got = l.canInsert(s.n, 0, size); got {
						l.inserted(s.n)
						size += s.n
					}
				case "sample":
					if got = l.canSample(s.n, size); got {
						l.sampled(s.n)
					}
				}
				if got != s.allowed {
					t.Fatalf("step %d (%s %d, inserts %d, samples %d): allowed %v, want %v",
						i, s.op, s.n, l.inserts, l.samples, got, s.allowed)
				}
			}
		})
	}
}

// TestLimiter_PendingCounts: inserts reserved but not committed count
// against the ratio, so many writers at once cannot overshoot it.
func TestLimiter_PendingCounts(t *testing.T) {
	l := newLimiter(RateLimit{MinSize: 1, SamplesPerInsert: 1, ErrorBuffer: 2})
	l.inserted(1)
	if !l.canInsert(2, 0, 1) {
		t.Fatal("2 inserts refused with nothing pending")
	}
	if l.canInsert(2, 1, 1) {
		t.Fatal("2 inserts allowed with 1 pending: diff would be 4 > 3")
	}
}
