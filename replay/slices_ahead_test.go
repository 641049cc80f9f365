package replay

import (
	"testing"
)

// TestClient_SlicesAhead: with WithSlicesAhead(4) a client by reference
// asks the node once for four samples' slices and serves the next three
// calls from them (the node counts 4 samples' steps at the first call, and
// no more until the fifth); every slice is whole and one episode's; a call
// with another spec asks the node again.
func TestClient_SlicesAhead(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 4096, Schema: stepSchema, TrajKey: []string{"episode"}})
	for ep := int64(1); ep <= 20; ep++ {
		if _, err := n.b.Extend(ctxT(t), steps(t, ep, 0, 40)); err != nil {
			t.Fatal(err)
		}
	}
	c := dialBuffer(t, n.addr, "buf", root, "ref", WithSlicesAhead(4))
	spec := SliceSpec{SliceLen: 8, NumSlices: 3}
	sampled := func() int64 {
		t.Helper()
		st, err := n.b.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.Sampled
	}
	base := sampled()
	per := int64(spec.SliceLen * spec.NumSlices)
	for call := 1; call <= 5; call++ {
		td, info, err := c.SampleSlices(ctxT(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkSlices(info, td, spec); err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		want := 4 * per // the first call asked for calls 1 to 4
		if call == 5 {
			want = 8 * per
		}
		if got := sampled() - base; got != want {
			t.Fatalf("after call %d the node counts %d steps sampled, want %d", call, got, want)
		}
	}
	other := SliceSpec{SliceLen: 4, NumSlices: 2}
	td, info, err := c.SampleSlices(ctxT(t), other)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSlices(info, td, other); err != nil {
		t.Fatal(err)
	}
	if got := sampled() - base; got != 8*per+4*int64(other.SliceLen*other.NumSlices) {
		t.Fatalf("another spec: the node counts %d steps sampled", got)
	}
}

// TestClient_SlicesAheadOverwritten: slices asked for ahead whose steps
// were all overwritten before they were used are sampled again: what the
// next calls return is whole and from the new episodes only.
func TestClient_SlicesAheadOverwritten(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 64, Schema: stepSchema, TrajKey: []string{"episode"}})
	for ep := int64(1); ep <= 4; ep++ {
		if _, err := n.b.Extend(ctxT(t), steps(t, ep, 0, 16)); err != nil {
			t.Fatal(err)
		}
	}
	c := dialBuffer(t, n.addr, "buf", root, "ref", WithSlicesAhead(8))
	spec := SliceSpec{SliceLen: 8, NumSlices: 2}
	if _, _, err := c.SampleSlices(ctxT(t), spec); err != nil { // seven samples' slices left
		t.Fatal(err)
	}
	for ep := int64(11); ep <= 14; ep++ { // every slot rewritten
		if _, err := n.b.Extend(ctxT(t), steps(t, ep, 0, 16)); err != nil {
			t.Fatal(err)
		}
	}
	for call := range 7 {
		td, info, err := c.SampleSlices(ctxT(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkSlices(info, td, spec); err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		for _, ep := range info.Episodes {
			if ep < 11 {
				t.Fatalf("call %d returned a slice of episode %d, overwritten before it was used", call, ep)
			}
		}
	}
}

// TestClient_SlicesFromANodeBeforePackedPicks: a node that ignores
// "packed" (as one from before it did) answers with info and mask; the
// client reads them, by reference and by bytes.
func TestClient_SlicesFromANodeBeforePackedPicks(t *testing.T) {
	for _, unpacked := range []bool{false, true} {
		root := t.TempDir()
		n := serveBuffer(t, root, "buf", Config{Capacity: 512, Schema: stepSchema, TrajKey: []string{"episode"}})
		n.svc.unpacked = unpacked
		for ep := int64(1); ep <= 6; ep++ {
			if _, err := n.b.Extend(ctxT(t), steps(t, ep, 0, 20)); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range modes {
			c := dialBuffer(t, n.addr, "buf", root, mode)
			spec := SliceSpec{SliceLen: 30, NumSlices: 4, PadShort: true}
			td, info, err := c.SampleSlices(ctxT(t), spec)
			if err != nil {
				t.Fatalf("unpacked %v, %s: %v", unpacked, mode, err)
			}
			if err := checkSlices(info, td, spec); err != nil {
				t.Fatalf("unpacked %v, %s: %v", unpacked, mode, err)
			}
			for i, m := range info.Mask {
				if m != (i%30 < 20) || (info.Indices[i] >= 0) != m {
					t.Fatalf("unpacked %v, %s: row %d mask %v index %d", unpacked, mode, i, m, info.Indices[i])
				}
			}
		}
	}
}
