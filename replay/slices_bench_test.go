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

// BenchmarkClient_SampleSlices: the same through a Client over loopback
// TCP, by reference (one call a sample, or one for 8) and by bytes.
func BenchmarkClient_SampleSlices(b *testing.B) {
	root := b.TempDir()
	n := serveBuffer(b, root, "buf", Config{Capacity: 20000, Schema: stepSchema, TrajKey: []string{"episode"}})
	for ep := int64(0); ep < 200; ep++ {
		if _, err := n.b.Extend(ctxT(b), steps(b, ep, 0, 100)); err != nil {
			b.Fatal(err)
		}
	}
	spec := SliceSpec{SliceLen: 32, NumSlices: 8}
	for _, mode := range []string{"ref", "ref-ahead8", "bytes"} {
		b.Run(mode, func(b *testing.B) {
			var c *Client
			if mode == "ref-ahead8" {
				c = dialBuffer(b, n.addr, "buf", root, "ref", WithSlicesAhead(8))
			} else {
				c = dialBuffer(b, n.addr, "buf", root, mode)
			}
			ctx := ctxT(b)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, _, err := c.SampleSlices(ctx, spec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
