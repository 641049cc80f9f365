package selector

import (
	"testing"
)

const benchCapacity = 50_000

// full returns a selector of the kind at index k of kinds with every slot
// inserted, priorities spread over two orders of magnitude.
func full(k int) Selector {
	s := kinds[k].new(benchCapacity)
	rng := newRand(1)
	for slot := range benchCapacity {
		s.Insert(slot, uint64(slot), 0.1+10*rng.Float64())
	}
	return s
}

// BenchmarkSelect selects 256 slots from a full selector of 50 000. FIFO's
// Select removes what it returns, so its loop also inserts those slots back
// as the newest: the steady state of a queue.
func BenchmarkSelect(b *testing.B) {
	const n = 256
	for k, kind := range kinds {
		b.Run(string(kind.name), func(b *testing.B) {
			s := full(k)
			rng := newRand(2)
			slots, weights := make([]int, 0, n), make([]float64, 0, n)
			seq := uint64(benchCapacity)
			for b.Loop() {
				var err error
				slots, weights, err = s.Select(rng, n, slots[:0], weights[:0])
				if err != nil {
					b.Fatal(err)
				}
				if kind.name == KindFIFO {
					for _, slot := range slots {
						s.Insert(slot, seq, 1)
						seq++
					}
				}
			}
		})
	}
}

// BenchmarkInsertRemove removes a random slot from a full selector of
// 50 000 and inserts it again as the newest, with a new priority.
func BenchmarkInsertRemove(b *testing.B) {
	for k, kind := range kinds {
		b.Run(string(kind.name), func(b *testing.B) {
			s := full(k)
			rng := newRand(3)
			seq := uint64(benchCapacity)
			for b.Loop() {
				slot := rng.IntN(benchCapacity)
				s.Remove(slot)
				s.Insert(slot, seq, 0.1+10*rng.Float64())
				seq++
			}
		})
	}
}
