package main

// p2pBufs keeps the buffers of an Isend's copy of its input and of an
// Irecv's tensor for the next ones: a large fresh buffer costs the Go
// runtime a clear of every byte or the kernel a fault per page, the
// larger part of a point-to-point message from Python that reused no
// memory (docs/benchmarks.md, "Point-to-point from Python"). Used by the
// sidecar's one goroutine that handles requests; not safe for concurrent
// use.
type p2pBufs struct {
	free [][]byte
}

const (
	p2pBufMin  = 64 << 10  // smaller buffers are allocated each time
	p2pBufKeep = 4         // buffers kept at most
	p2pBufMax  = 256 << 20 // and their bytes at most
)

// take returns n bytes, not zeroed when reused: the caller overwrites
// them whole (an Isend's copy) or hands them to a receive that fills them
// before anyone reads them (an Irecv's, whose Wait succeeded).
func (p *p2pBufs) take(n int) []byte {
	if n >= p2pBufMin {
		for i, b := range p.free {
			if cap(b) >= n && cap(b) <= 2*n {
				p.free = append(p.free[:i], p.free[i+1:]...)
				return b[:n]
			}
		}
	}
	return make([]byte, n)
}

// put keeps b for a later take, once nothing reads or writes it (its
// request completed), dropping the smallest kept buffer when full.
func (p *p2pBufs) put(b []byte) {
	if cap(b) < p2pBufMin || cap(b) > p2pBufMax {
		return
	}
	total := cap(b)
	for _, f := range p.free {
		total += cap(f)
	}
	for len(p.free) > 0 && (len(p.free) >= p2pBufKeep || total > p2pBufMax) {
		small := 0
		for i, f := range p.free {
			if cap(f) < cap(p.free[small]) {
				small = i
			}
		}
		total -= cap(p.free[small])
		p.free = append(p.free[:small], p.free[small+1:]...)
	}
	if total <= p2pBufMax {
		p.free = append(p.free, b[:cap(b)])
	}
}
