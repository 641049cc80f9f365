package replay

import (
	"slices"
	"testing"
	"time"
)

// TestRemote_ResampleKeepsRowsDistinct: a client by reference that finds a
// row of a lifo or heap sample overwritten picks the whole sample again,
// as the Buffer does (TestSelectors_ResampleKeepsRowsDistinct): a pick of
// one would be the top of the order again, a row already in the sample.
// The row goes while the client's prefetched picks wait (WithPrefetch), so
// the next sample finds it gone.
func TestRemote_ResampleKeepsRowsDistinct(t *testing.T) {
	for _, tc := range []struct {
		sampler Sampler
		prios   []float64 // the order 3, 2, 1
	}{
		{LIFO(), nil}, {MaxHeap(), []float64{1, 2, 3}}, {MinHeap(), []float64{3, 2, 1}},
	} {
		t.Run(tc.sampler.String(), func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 4, Sampler: tc.sampler})
			ctx := ctxT(t)
			if _, err := n.b.ExtendPriority(ctx, transitions(t, 1, 2, 3), tc.prios); err != nil {
				t.Fatal(err)
			}
			c := dialBuffer(t, n.addr, "buf", root, "ref+prefetch")
			td, info, err := c.Sample(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			if ids := rowIDs(t, td); !slices.Equal(ids, []int{3, 2}) {
				t.Fatalf("first sample %v; want [3 2]", ids)
			}
			// The prefetch of the next sample's picks (3 and 2 again) is in
			// once the node has counted four rows sampled.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				st, err := n.b.Stats()
				if err != nil {
					t.Fatal(err)
				}
				if st.Sampled == 4 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the prefetch was not made: %d sampled", st.Sampled)
				}
			}
			// Another trainer deletes row 2 before the client copies it.
			if d, err := n.b.Delete(ctx, SampleInfo{Indices: info.Indices[1:], IDs: info.IDs[1:]}); err != nil || d != 1 {
				t.Fatalf("Delete: %d, %v", d, err)
			}
			td, info, err = c.Sample(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			if ids := rowIDs(t, td); !slices.Equal(ids, []int{3, 1}) {
				t.Fatalf("the sample of 2 holds %v (slots %v); want the first 2 left in the order, [3 1]", ids, info.Indices)
			}
		})
	}
}
