package replay

import (
	"context"
	"slices"
	"sync"

	"github.com/tensorwire/tensorwire/tensordict"
)

// sentBatches keeps the batches a node sent by bytes (replay.sample and
// replay.sample_slices) for its next samples by bytes. 256 Atari-sized
// rows are a 7.2 MB batch, which a new allocation zeroes and, once Go's
// runtime has given its pages back to the kernel, faults in again a page
// at a time. A batch
// comes back once rpc has written it (rpc.TD.Release) and goes to a
// sample of the same buffer, size and schema; at most maxSentBatches
// batches and maxSentBytes bytes are kept, the oldest dropped first. Safe
// for concurrent use; the zero value is empty.
type sentBatches struct {
	mu    sync.Mutex
	free  []sentBatch // the most recently returned last
	bytes int64
}

type sentBatch struct {
	b      *Buffer
	schema tensordict.RowSchema
	td     *tensordict.TensorDict
	bytes  int64
}

const (
	maxSentBatches = 4
	maxSentBytes   = 256 << 20
)

// batch returns a batch for n rows of b's schema (Buffer.batchSchema,
// what as there), a kept one or new, and the function that returns it to
// the pool, to be called once nothing reads it any more (rpc.TD.Release,
// or at once when the sample failed).
func (p *sentBatches) batch(ctx context.Context, b *Buffer, n int, what string) (*tensordict.TensorDict, func(), error) {
	schema, bytes, err := b.batchSchema(ctx, n, what)
	if err != nil {
		return nil, nil, err
	}
	td := p.take(b, schema, n)
	if td == nil {
		if td, err = schema.Zeros(n); err != nil {
			return nil, nil, err
		}
	}
	return td, func() { p.put(sentBatch{b: b, schema: schema, td: td, bytes: bytes}) }, nil
}

// take removes and returns a kept batch for n rows of b with schema, or
// nil.
func (p *sentBatches) take(b *Buffer, schema tensordict.RowSchema, n int) *tensordict.TensorDict {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.free) - 1; i >= 0; i-- {
		e := p.free[i]
		if e.b == b && e.td.BatchSize()[0] == n && e.schema.Match(schema) == nil {
			p.free = slices.Delete(p.free, i, i+1)
			p.bytes -= e.bytes
			return e.td
		}
	}
	return nil
}

// put keeps e's batch, dropping the oldest ones past the bounds (and e's
// itself when it alone is over half of maxSentBytes).
func (p *sentBatches) put(e sentBatch) {
	if e.bytes > maxSentBytes/2 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.free) > 0 && (len(p.free) == maxSentBatches || p.bytes+e.bytes > maxSentBytes) {
		p.bytes -= p.free[0].bytes
		p.free = slices.Delete(p.free, 0, 1)
	}
	p.free = append(p.free, e)
	p.bytes += e.bytes
}
