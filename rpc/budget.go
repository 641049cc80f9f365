package rpc

import (
	"context"
	"sync"
)

// budget bounds the bytes of bodies one peer may have a server allocate
// before they arrive: a request header claims its body's size, and the
// tensors that receive it are allocated before the first byte is read, so
// without a bound a peer could claim MaxBodyBytes on each of its streams
// and send nothing (200 such claims took 800 GB of the node's heap, in
// address space, and put the garbage collector's goal out of reach).
//
// A call's body holds its share until the handler returns (the handler
// owns the memory meanwhile); a stream message's until its bytes are in.
// A claim larger than the whole budget is never made: checkLens refuses a
// body over MaxBodyBytes, the budget's size.
type budget struct {
	mu   sync.Mutex
	free int64
	wake chan struct{} // closed when bytes are given back
}

// budgetMin is the body size under which no share is taken: small bodies
// are bounded well enough by the number of streams.
const budgetMin = 1 << 20

func newBudget(n int64) *budget { return &budget{free: n, wake: make(chan struct{})} }

// take waits until n bytes are free and takes them; it reports false if
// done is closed first. take(0) is free.
func (b *budget) take(n int64, done <-chan struct{}) bool {
	if n < budgetMin {
		return true
	}
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			return true
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-done:
			return false
		}
	}
}

// give returns n bytes taken with take.
func (b *budget) give(n int64) {
	if n < budgetMin {
		return
	}
	b.mu.Lock()
	b.free += n
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
}

// takeBody takes a request's body share (the larger of its sizes on the
// wire and decompressed), waiting until the call's deadline (timeoutUS,
// none when 0) or parent's end; the error, ResourceExhausted, is the
// call's answer when the share never came free.
func (b *budget) takeBody(parent context.Context, method string, bodyLen, rawLen, timeoutUS, limit int64) (took int64, err error) {
	need := max(bodyLen, rawLen)
	if need < budgetMin {
		return 0, nil
	}
	ctx, cancel := callContext(parent, timeoutUS)
	defer cancel()
	if !b.take(need, ctx.Done()) {
		return 0, Errorf(ResourceExhausted, "%s: this peer's bodies being received would pass %d bytes (Limits.MaxBodyBytes)", method, limit)
	}
	return need, nil
}
