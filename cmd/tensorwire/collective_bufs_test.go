package main

import "testing"

// TestP2PBufs: a buffer put back serves the next take of a size it fits
// (at most twice that size), small ones are not kept, and the kept ones
// stay within p2pBufKeep buffers and p2pBufMax bytes, the smallest going
// first.
func TestP2PBufs(t *testing.T) {
	var p p2pBufs
	a := p.take(1 << 20)
	p.put(a)
	if b := p.take(1 << 20); &b[0] != &a[0] {
		t.Error("a buffer put back was not reused for the same size")
	}
	p.put(a)
	if b := p.take(300 << 10); &b[0] == &a[0] {
		t.Error("a 1 MiB buffer served a take of 300 KiB (more than twice it)")
	}
	if b := p.take(600 << 10); &b[0] != &a[0] || len(b) != 600<<10 {
		t.Error("a 1 MiB buffer did not serve a take of 600 KiB")
	}
	p.put(make([]byte, 1<<10))
	if len(p.free) != 0 {
		t.Errorf("a 1 KiB buffer was kept: %d kept", len(p.free))
	}
	for i := range p2pBufKeep + 2 {
		p.put(make([]byte, (i+1)<<20))
	}
	if len(p.free) != p2pBufKeep {
		t.Fatalf("%d kept, want %d", len(p.free), p2pBufKeep)
	}
	for _, b := range p.free {
		if cap(b) < 3<<20 {
			t.Errorf("kept a %d-byte buffer over larger ones", cap(b))
		}
	}
	p.put(make([]byte, 200<<20))
	total := 0
	for _, b := range p.free {
		total += cap(b)
	}
	if total > p2pBufMax {
		t.Errorf("%d bytes kept, over %d", total, p2pBufMax)
	}
	p.put(make([]byte, p2pBufMax+1))
	for _, b := range p.free {
		if cap(b) > p2pBufMax {
			t.Error("kept a buffer over p2pBufMax")
		}
	}
}
