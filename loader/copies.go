package loader

import (
	"sync"
	"sync/atomic"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// batchCopies are the copies, in Go memory, of ring batches that a node
// sends to its consumers by bytes, shared by those consumers: N consumers
// by bytes cost one copy out of the ring a batch, not N, and one
// compression (each copy's rpc.Seal, reset when its memory is lent on). A copy is keyed by
// the batch's slot and word, which name one batch for the ring's life, so a
// copy served after its slot was rewritten is still that batch, whole (it
// was checked against the word when made). Copies no stream is sending
// are kept, newest last, up to maxIdle (at most the ring's slots, 4, and
// 256 MiB), for a stream that comes to the batch later; the oldest then
// lends its memory to the next copy. A producer never publishes a batch a
// ring ahead of a consumer's release, so on a ring of at most maxIdle
// slots every batch is copied once (a consumer that joins late aside); on
// a larger one, consumers by bytes more than maxIdle batches apart copy
// again what the kept copies no longer hold. The zero value is ready; its
// methods are safe for concurrent use.
type batchCopies struct {
	mu    sync.Mutex
	byKey map[copyKey]*batchCopy
	idle  []*batchCopy // refs 0, oldest first
	limit int          // idle copies kept at most (maxIdle), set at the first acquire
	made  atomic.Int64 // copies made out of the ring (tests)
}

// maxIdleCopies and maxIdleBytes bound the copies kept that no stream is
// sending.
const (
	maxIdleCopies = 4
	maxIdleBytes  = 256 << 20
)

type copyKey struct {
	slot int
	word uint64
}

// batchCopy is a batch copied out of the ring: td, the first rows of buf,
// once ready is closed and err is nil.
type batchCopy struct {
	key   copyKey
	buf   *tensordict.TensorDict // a ring slot's rows, Go memory
	td    *tensordict.TensorDict
	seal  *rpc.Seal // td's body compressed once for every stream (buf's: reset when buf is lent on)
	refs  int       // streams holding it (under batchCopies.mu)
	ready chan struct{}
	err   error
}

// acquire returns the copy of the batch a announces, made now (into the
// memory of the oldest idle copy when as many are kept as may be) or by
// another stream before; release it once sent. An error is copyBatch's:
// ErrDropped when the slot was rewritten while it was copied.
func (c *batchCopies) acquire(p *Producer, a announcement) (*batchCopy, error) {
	key := copyKey{a.Slot, a.Word}
	c.mu.Lock()
	if c.byKey == nil {
		c.byKey, c.limit = map[copyKey]*batchCopy{}, c.maxIdle(p)
	}
	if bc := c.byKey[key]; bc != nil {
		if bc.refs == 0 {
			c.unidleLocked(bc)
		}
		bc.refs++
		c.mu.Unlock()
		<-bc.ready
		if bc.err != nil {
			c.release(bc)
			return nil, bc.err
		}
		return bc, nil
	}
	bc := &batchCopy{key: key, refs: 1, ready: make(chan struct{})}
	if len(c.idle) > 0 && len(c.idle) >= c.limit {
		old := c.idle[0]
		c.idle = c.idle[1:]
		delete(c.byKey, old.key)
		bc.buf, bc.seal = old.buf, old.seal
		bc.seal.Reset() // idle: no stream sends old
	}
	if bc.seal == nil {
		bc.seal = new(rpc.Seal)
	}
	c.byKey[key] = bc
	c.mu.Unlock()
	var err error
	if bc.buf == nil {
		bc.buf, err = p.schema.Zeros(p.ring.batch)
	}
	if err == nil {
		bc.td, err = p.copyBatch(a, bc.buf)
	}
	bc.err = err
	close(bc.ready)
	if err != nil {
		c.release(bc)
		return nil, err
	}
	c.made.Add(1)
	return bc, nil
}

// release gives up a stream's hold on bc: kept idle for later streams
// once none holds it, the oldest idle copies beyond the limit forgotten
// (a failed copy is forgotten at once).
func (c *batchCopies) release(bc *batchCopy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if bc.refs--; bc.refs > 0 {
		return
	}
	if bc.err != nil {
		if c.byKey[bc.key] == bc {
			delete(c.byKey, bc.key)
		}
		return
	}
	c.idle = append(c.idle, bc)
	for len(c.idle) > c.limit {
		delete(c.byKey, c.idle[0].key)
		c.idle[0] = nil
		c.idle = c.idle[1:]
	}
}

// unidleLocked takes bc, idle, off the idle list.
func (c *batchCopies) unidleLocked(bc *batchCopy) {
	for i, x := range c.idle {
		if x == bc {
			c.idle = append(c.idle[:i], c.idle[i+1:]...)
			return
		}
	}
}

// maxIdle is how many idle copies p's batches may keep: at most the
// ring's slots, maxIdleCopies and maxIdleBytes, and at least one.
func (c *batchCopies) maxIdle(p *Producer) int {
	n := min(p.cfg.Slots, maxIdleCopies)
	if b := p.schema.RowBytes() * p.ring.batch; b > 0 {
		n = min(n, maxIdleBytes/b)
	}
	return max(n, 1)
}
