package replay

import (
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestSentBatches: a kept batch goes only to a sample of its buffer, size
// and schema, once; the bounds drop the oldest first.
func TestSentBatches(t *testing.T) {
	s1 := tensordict.RowSchema{{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{4}}}
	s2 := tensordict.RowSchema{{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{5}}}
	b1, b2 := &Buffer{}, &Buffer{}
	batch := func(s tensordict.RowSchema, n int) sentBatch {
		td, err := s.Zeros(n)
		if err != nil {
			t.Fatal(err)
		}
		return sentBatch{schema: s, td: td, bytes: int64(n * s.RowBytes())}
	}
	on := func(b *Buffer, e sentBatch) sentBatch { e.b = b; return e }

	var p sentBatches
	e := on(b1, batch(s1, 8))
	p.put(e)
	for _, miss := range []struct {
		name string
		b    *Buffer
		s    tensordict.RowSchema
		n    int
	}{{"another buffer", b2, s1, 8}, {"another size", b1, s1, 9}, {"another schema", b1, s2, 8}} {
		if p.take(miss.b, miss.s, miss.n) != nil {
			t.Errorf("%s: took the kept batch", miss.name)
		}
	}
	if got := p.take(b1, s1.Clone(), 8); got != e.td {
		t.Fatal("the kept batch was not taken by a sample of its buffer, size and schema")
	}
	if p.take(b1, s1, 8) != nil || p.bytes != 0 {
		t.Fatalf("taken twice, or %d bytes still counted", p.bytes)
	}

	// At most maxSentBatches: the oldest goes first.
	var kept []sentBatch
	for i := range maxSentBatches + 1 {
		e := on(b1, batch(s1, i+1))
		kept = append(kept, e)
		p.put(e)
	}
	if p.take(b1, s1, 1) != nil {
		t.Error("the oldest batch was kept past maxSentBatches")
	}
	if p.take(b1, s1, maxSentBatches+1) != kept[maxSentBatches].td {
		t.Error("the newest batch was not kept")
	}

	// At most maxSentBytes; a batch over half of it is not kept.
	p = sentBatches{}
	big := on(b1, batch(s1, maxSentBytes/2/4+1)) // just over half
	p.put(big)
	if len(p.free) != 0 || p.bytes != 0 {
		t.Errorf("a batch of %d bytes was kept (bound %d)", big.bytes, maxSentBytes)
	}
	half := on(b1, batch(s1, maxSentBytes/2/4))
	p.put(half)
	p.put(on(b2, batch(s1, maxSentBytes/2/4)))
	p.put(on(b1, batch(s1, 2)))
	if p.bytes > maxSentBytes || p.take(b1, s1, maxSentBytes/2/4) != nil {
		t.Errorf("%d bytes kept, the oldest half-size batch among them: want at most %d, oldest dropped", p.bytes, maxSentBytes)
	}
}

// TestService_BytesSamplesReuseSentBatches: by bytes, the node's
// replay.sample and replay.sample_slices gather into the batch of an
// earlier answer once rpc released it (and only then), with rows as right
// as in a new one.
func TestService_BytesSamplesReuseSentBatches(t *testing.T) {
	b := create(t, Config{Capacity: 64, Schema: stepSchema, TrajKey: []string{"episode"}})
	ctx := ctxT(t)
	for ep := int64(1); ep <= 4; ep++ {
		if _, err := b.Extend(ctx, steps(t, ep, 0, 8)); err != nil {
			t.Fatal(err)
		}
	}
	svc := serveAt(t, b, "x")
	spec := SliceSpec{SliceLen: 4, NumSlices: 6}
	for _, tc := range []struct {
		name   string
		sample func() (*rpc.TD, error)
	}{
		{"sample", func() (*rpc.TD, error) {
			r, err := svc.sample(ctx, sampleRequest{Name: "buf", N: 24, Bytes: true})
			if err == nil {
				_, _, err = stepsOf(r.Batch.TensorDict)
			}
			return r.Batch, err
		}},
		{"sample_slices", func() (*rpc.TD, error) {
			r, err := svc.sampleSlices(ctx, slicesRequest{Name: "buf", Bytes: true, SliceLen: spec.SliceLen, NumSlices: spec.NumSlices})
			if err == nil {
				err = checkSlices(SliceInfo{SampleInfo: r.Info, Mask: r.Mask, Episodes: r.Episodes}, r.Batch.TensorDict, spec)
			}
			return r.Batch, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := tc.sample()
			if err != nil {
				t.Fatal(err)
			}
			if first.Release == nil {
				t.Fatal("no Release: the batch cannot come back")
			}
			held, err := tc.sample() // first not released: another batch
			if err != nil {
				t.Fatal(err)
			}
			if held.TensorDict == first.TensorDict {
				t.Fatal("a batch still being sent was given to another sample")
			}
			first.Release()
			again, err := tc.sample()
			if err != nil {
				t.Fatal(err)
			}
			if again.TensorDict != first.TensorDict {
				t.Error("the released batch was not reused")
			}
			held.Release()
			again.Release()
		})
	}
}
