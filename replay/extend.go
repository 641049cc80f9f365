package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Extend adds a batch of transitions, a TensorDict of batch size [B] whose
// tensors match the buffer's schema (the first batch sets it when the
// buffer has none), and returns the slot each went to (-1 for a
// transition a top-k writer dropped). It waits while the rate limiter holds
// inserts back, until ctx ends. A batch that does not match is refused
// with ErrSchema and nothing is written.
//
// New transitions get the largest priority seen so far; ExtendPriority sets
// theirs.
func (b *Buffer) Extend(ctx context.Context, td *tensordict.TensorDict) ([]int, error) {
	return b.ExtendPriority(ctx, td, nil)
}

// ExtendPriority is Extend with a priority for each transition (nil: the
// largest seen so far), finite and not negative.
func (b *Buffer) ExtendPriority(ctx context.Context, td *tensordict.TensorDict, priorities []float64) ([]int, error) {
	n, keys, err := checkExtend(td, priorities, b.cfg.Writer)
	if err != nil {
		return nil, err
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.leave()
	r, storage, err := b.reserve(ctx, td.RowSchema(), n, keys)
	if err != nil {
		return nil, err
	}
	if err := writeRows(storage, r.slots, td); err != nil {
		b.expire(r.rid)
		return nil, b.noteFault(err)
	}
	return b.commit(r.rid, r.slots, priorities)
}

// writeRows writes td's rows into storage at slots, skipping rows whose slot
// is -1 (a top-k writer dropped them).
func writeRows(storage *tensordict.TensorDict, slots []int, td *tensordict.TensorDict) error {
	if !slices.Contains(slots, -1) {
		return storage.SetRows(slots, td)
	}
	var kept, rows []int
	for i, s := range slots {
		if s >= 0 {
			kept = append(kept, s)
			rows = append(rows, i)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	src, err := td.Gather(rows)
	if err != nil {
		return err
	}
	return storage.SetRows(kept, src)
}

// batchLen checks that td is a batch of transitions and returns its length.
func batchLen(td *tensordict.TensorDict) (int, error) {
	if td == nil {
		return 0, schemaErrorf("no batch")
	}
	bs := td.BatchSize()
	if len(bs) != 1 {
		return 0, schemaErrorf("batch size %v, want [N]", bs)
	}
	if bs[0] == 0 {
		return 0, schemaErrorf("empty batch")
	}
	return bs[0], nil
}

func checkPriorities(p []float64, n int) error {
	if p == nil {
		return nil
	}
	if len(p) != n {
		return schemaErrorf("%d priorities for %d transitions", len(p), n)
	}
	for i, v := range p {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return schemaErrorf("priority %d is %v; want a finite number >= 0", i, v)
		}
	}
	return nil
}

// checkExtend checks a batch and its priorities before an Extend, and
// returns its length and, for a top-k writer, its transitions' keys.
func checkExtend(td *tensordict.TensorDict, priorities []float64, w Writer) (n int, keys []float64, err error) {
	if n, err = batchLen(td); err != nil {
		return 0, nil, err
	}
	if err := checkPriorities(priorities, n); err != nil {
		return 0, nil, err
	}
	if w.ranks() {
		if keys, err = rankKeys(td, w.spec.Key); err != nil {
			return 0, nil, err
		}
	}
	return n, keys, nil
}

// rankKeys reads the ranking key of each row of td: a tensor at key with one
// element per row.
func rankKeys(td *tensordict.TensorDict, key []string) ([]float64, error) {
	t, err := td.Tensor(key...)
	if err != nil {
		return nil, schemaErrorf("the top-k writer ranks by %v: %v", key, err)
	}
	n := t.Len()
	if t.NumElements() != n {
		return nil, schemaErrorf("the top-k key %v has shape %v; want one element per transition", key, t.Shape())
	}
	raw, err := t.Bytes()
	if err != nil {
		return nil, err
	}
	keys := make([]float64, n)
	size := t.DType().Size()
	for i := range keys {
		keys[i] = t.DType().Float64(raw[i*size : (i+1)*size])
		if math.IsNaN(keys[i]) {
			return nil, schemaErrorf("top-k key of transition %d is NaN", i)
		}
	}
	return keys, nil
}

// reserve takes slots for n transitions of the given schema, creating the
// storage if the buffer has none, once the rate limiter lets them in.
// The slots leave the sampler at once, and their words move to a new
// generation, so samplers reading them see the change.
func (b *Buffer) reserve(ctx context.Context, schema tensordict.RowSchema, n int, keys []float64) (*reservation, *tensordict.TensorDict, error) {
	if n > b.cfg.Capacity || n > 1<<rowBits {
		return nil, nil, schemaErrorf("a batch of %d transitions does not fit a buffer of %d (or is over %d)", n, b.cfg.Capacity, 1<<rowBits)
	}
	if (keys != nil || b.cfg.Writer.ranks()) && len(keys) != n {
		return nil, nil, schemaErrorf("%d keys for %d transitions (the writer is %s)", len(keys), n, b.cfg.Writer)
	}
	for i, k := range keys {
		if math.IsNaN(k) {
			return nil, nil, schemaErrorf("top-k key of transition %d is NaN", i)
		}
	}
	if err := b.health(false); err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.schema == nil {
		if err := schema.Validate(); err != nil {
			return nil, nil, schemaErrorf("%v", err)
		}
		if b.cfg.TrajKey != nil {
			if err := checkTrajKey(schema, b.cfg.TrajKey); err != nil {
				return nil, nil, schemaErrorf("%v", err)
			}
		}
		if b.closed.Load() {
			return nil, nil, ErrClosed
		}
		if err := b.createStorage(schema); err != nil {
			return nil, nil, err
		}
		if err := b.writeMetaLocked(); err != nil {
			return nil, nil, err
		}
	} else if err := b.schema.Match(schema); err != nil {
		return nil, nil, schemaErrorf("%v", err)
	}
	for !b.closed.Load() && b.lost == nil && !b.limit.canInsert(n, b.pending, b.sel.Len()) {
		if err := b.wait(ctx); err != nil {
			return nil, nil, err
		}
	}
	if b.closed.Load() {
		return nil, nil, ErrClosed
	}
	if b.lost != nil {
		return nil, nil, b.lost
	}
	if b.nextRID >= b.ridLimit {
		if err := b.raiseRIDLimit(); err != nil {
			return nil, nil, err
		}
	}
	slots, err := b.writer.choose(b.slots, n, keys)
	if errors.Is(err, ErrFull) {
		// Slots held by writers that cannot write them (the storage was
		// truncated under them) would end here too: say so if it is that.
		if lost := b.healthLocked(); lost != nil {
			return nil, nil, lost
		}
	}
	if err != nil {
		return nil, nil, err
	}
	r := &reservation{rid: b.nextRID, slots: slots, keys: keys}
	b.nextRID++
	for row, s := range slots {
		if s < 0 {
			continue
		}
		b.selRemove(s)
		b.epRemove(s)
		// The order of the two writes is what a node killed between them
		// leaves for Open (recover). A committed slot turns writing
		// first, keeping the seq of the reservation that wrote its row,
		// which recover then keeps whole; an empty one (expired,
		// deleted) takes the new seq first, so that it never looks like
		// a writing slot of the reservation that once filled it.
		w := b.slots.word(s)
		if state(w) == stateCommitted {
			b.slots.setWord(s, makeWord(gen(w)+1, stateWriting))
			slotWritten()
			b.slots.setSeq(s, r.rid, row)
		} else {
			b.slots.setSeq(s, r.rid, row)
			slotWritten()
			b.slots.setWord(s, makeWord(gen(w)+1, stateWriting))
		}
		slotWritten()
		b.pending++
	}
	b.resv[r.rid] = r
	r.timer = time.AfterFunc(b.cfg.Lease, func() { b.expire(r.rid) })
	return r, b.storage, nil
}

// testSlotWritten, when a test sets it, runs after each write of reserve
// and commit to the slot table, with the buffer's lock held: a copy of the
// files made there is what a node killed at that point leaves.
var testSlotWritten func()

func slotWritten() {
	if testSlotWritten != nil {
		testSlotWritten()
	}
}

// commit makes a reservation's slots sampleable, with priorities (nil: the
// largest seen so far). slots is what the writer was given, and must be
// the reservation's (ErrSchema otherwise, the reservation left as it is).
// If the reservation is gone, commit succeeds if it was committed (a
// retried commit whose first reply was lost; committedBefore) and fails
// with ErrExpired if it was not.
func (b *Buffer) commit(rid uint64, slots []int, priorities []float64) ([]int, error) {
	// Nothing is acknowledged once the files are gone.
	if err := b.health(false); err != nil {
		return nil, err
	}
	b.commitMu.RLock()
	defer b.commitMu.RUnlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if b.lost != nil {
		return nil, b.lost
	}
	r := b.resv[rid]
	if r == nil {
		if b.committedBefore(rid, slots) {
			return slots, nil
		}
		return nil, fmt.Errorf("%w: reservation %d", ErrExpired, rid)
	}
	if !slices.Equal(slots, r.slots) {
		return nil, schemaErrorf("a commit of reservation %d names other slots than the %d it holds", rid, len(r.slots))
	}
	if priorities != nil && len(priorities) != len(r.slots) {
		return nil, schemaErrorf("%d priorities for %d transitions", len(priorities), len(r.slots))
	}
	r.timer.Stop()
	delete(b.resv, rid)
	// Every slot's priority and key first, then the words: a node killed
	// between two words leaves a commit that Open finishes (recover), each
	// slot with what this commit gave it.
	for i, s := range r.slots {
		if s < 0 {
			continue
		}
		p := b.maxPrio
		if priorities != nil {
			p = priorities[i]
			b.maxPrio = max(b.maxPrio, p)
		}
		key := 0.0
		if r.keys != nil {
			key = r.keys[i]
		}
		b.slots.setPriority(s, p)
		b.slots.setKey(s, key)
		slotWritten()
	}
	n := 0
	for _, s := range r.slots {
		if s < 0 {
			continue
		}
		b.slots.setWord(s, makeWord(gen(b.slots.word(s)), stateCommitted))
		slotWritten()
		b.selInsert(s, b.slots.seq(s), b.slots.priority(s))
		b.epAdd(s)
		b.writer.committed(s, b.slots.key(s))
		n++
	}
	b.pending -= n
	b.limit.inserted(n)
	b.broadcast()
	return r.slots, nil
}

// committedBefore reports whether reservation rid, which b no longer
// holds, was committed with slots: a commit retried after its first reply
// was lost, whose rows may have been overwritten or deleted since. b.mu is
// held.
//
// Slots the slot table shows were never rid's (a slot last taken before
// rid, or by rid for another row of its batch) make it false. Then a
// reservation of this Buffer was committed unless it expired, which
// expired records; one of an earlier process (a restart between the
// commit and its retry), or one older than that record reaches, is judged
// by the slot table alone: committed if one of its slots still holds its
// row committed. Only commit marks a slot committed under its rid, so the
// answer is never yes for a batch that is not in; it is no for a batch
// that was, whose rows all left the buffer before the retry came, and its
// writer adds it again (never twice at once: its rows all left).
func (b *Buffer) committedBefore(rid uint64, slots []int) bool {
	if rid == 0 || rid >= b.nextRID || len(slots) > 1<<rowBits {
		return false // never handed out (ids never repeat: raiseRIDLimit)
	}
	held := false // a slot holds its row committed
	for row, s := range slots {
		if s < 0 {
			continue
		}
		if s >= b.cfg.Capacity {
			return false
		}
		seq := b.slots.seq(s)
		switch by := seq >> rowBits; {
		case by < rid:
			return false
		case by == rid:
			if seq&(1<<rowBits-1) != uint64(row) {
				return false
			}
			held = held || state(b.slots.word(s)) == stateCommitted
		}
	}
	if rid >= b.firstRID && !b.expired.has(rid) {
		return true
	}
	return held
}

// expiredRIDs records the reservations of a Buffer that ended
// uncommitted (expire): the last maxExpiredRIDs of them at least, in set;
// the others are at most floor.
type expiredRIDs struct {
	set   map[uint64]struct{}
	floor uint64
}

// maxExpiredRIDs bounds expiredRIDs: 4096 rids, about 100 KiB. Beyond it
// a retried commit of an old reservation is judged by the slot table
// (committedBefore).
const maxExpiredRIDs = 4096

func (e *expiredRIDs) add(rid uint64) {
	if len(e.set) >= maxExpiredRIDs {
		for r := range e.set {
			e.floor = max(e.floor, r)
		}
		clear(e.set)
	}
	if e.set == nil {
		e.set = map[uint64]struct{}{}
	}
	e.set[rid] = struct{}{}
}

// has reports whether rid may have expired: it did if it is in set, and
// may have if it is at most floor.
func (e *expiredRIDs) has(rid uint64) bool {
	_, ok := e.set[rid]
	return ok || rid <= e.floor
}

// expire gives an uncommitted reservation's slots back: empty, never to be
// sampled until written again.
func (b *Buffer) expire(rid uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.resv[rid]
	if r == nil || b.closed.Load() {
		return
	}
	r.timer.Stop()
	delete(b.resv, rid)
	b.expired.add(rid)
	for _, s := range r.slots {
		if s < 0 {
			continue
		}
		b.slots.setWord(s, makeWord(gen(b.slots.word(s)), stateEmpty))
		b.writer.expired(s)
		b.pending--
	}
	b.stats.Expired++
	b.broadcast()
}
