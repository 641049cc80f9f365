package replay

import "testing"

// BenchmarkSampleSlices: 8 slices of 32 steps from 200 episodes of 100.
func BenchmarkSampleSlices(b *testing.B) {
	buf := create(b, Config{Capacity: 20000, Schema: stepSchema, TrajKey: []string{"episode"}})
	for ep := int64(0); ep < 200; ep++ {
		if _, err := buf.Extend(ctxT(b), steps(b, ep, 0, 100)); err != nil {
			b.Fatal(err)
		}
	}
	spec := SliceSpec{SliceLen: 32, NumSlices: 8}
	ctx := ctxT(b)
	b.ResetTimer()
	for range b.N {
		if _, _, err := buf.SampleSlices(ctx, spec); err != nil {
			b.Fatal(err)
		}
	}
}
