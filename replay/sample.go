package replay

import (
	"context"
	"fmt"
	"slices"

	"github.com/tensorwire/tensorwire/tensordict"
)

// SampleInfo describes the transitions a sample returned, row by row.
type SampleInfo struct {
	Indices []int `codec:"indices"` // their slots
	// IDs are their slots' generations: how many times a writer had taken
	// each slot when it was sampled. A slot overwritten since has another;
	// UpdatePriority skips a row whose slot's generation is no longer its
	// ID. (A generation is the slot table's word without its state bits,
	// word>>2; docs/replay.md.)
	IDs     []uint64  `codec:"ids"`
	Weights []float64 `codec:"weights"` // importance weights (prioritized sampling; 1 otherwise)
}

// Sample returns n transitions chosen by the buffer's sampler, copied into
// a new TensorDict in Go memory, and what they are (SampleInfo). It waits
// while the buffer cannot give n (fewer than the rate limiter's MinSize,
// an empty buffer, a FIFO buffer with fewer than n) until ctx ends.
//
// n must be positive and at most 2^20 (ErrArgument), and the rows it takes
// at most 1 GiB.
func (b *Buffer) Sample(ctx context.Context, n int) (*tensordict.TensorDict, SampleInfo, error) {
	if err := checkSampleSize(n); err != nil {
		return nil, SampleInfo{}, err
	}
	schema, _, err := b.batchSchema(ctx, n, "transitions")
	if err != nil {
		return nil, SampleInfo{}, err
	}
	return sampleNew(ctx, schema, n, b.SampleInto)
}

// batchSchema waits until b has a schema and returns it with the bytes of
// a batch of n rows, refused (ErrArgument) past maxSampleBytes; what the
// rows are ("transitions", "steps") is for that error.
func (b *Buffer) batchSchema(ctx context.Context, n int, what string) (tensordict.RowSchema, int64, error) {
	if err := b.waitSchema(ctx); err != nil {
		return nil, 0, err
	}
	schema := b.Schema()
	bytes := int64(n) * int64(schema.RowBytes())
	if bytes > maxSampleBytes {
		return nil, 0, argumentErrorf("a sample of %d %s is %d bytes; at most %d in one call", n, what, bytes, int64(maxSampleBytes))
	}
	return schema, bytes, nil
}

// sampleNew is a Sample of n transitions of schema: SampleInto into a new
// batch.
func sampleNew(ctx context.Context, schema tensordict.RowSchema, n int,
	sampleInto func(context.Context, *tensordict.TensorDict) (SampleInfo, error)) (*tensordict.TensorDict, SampleInfo, error) {
	dst, err := schema.Zeros(n)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	info, err := sampleInto(ctx, dst)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	return dst, info, nil
}

// SampleInto is Sample into dst, a TensorDict with the buffer's schema and
// batch size [n] (from an earlier Sample, say), without allocating it.
func (b *Buffer) SampleInto(ctx context.Context, dst *tensordict.TensorDict) (SampleInfo, error) {
	n, err := batchLen(dst)
	if err != nil {
		return SampleInfo{}, err
	}
	if err := b.enter(); err != nil {
		return SampleInfo{}, err
	}
	defer b.leave()
	var info SampleInfo
	if err := b.pick(ctx, n, &info); err != nil {
		return SampleInfo{}, err
	}
	b.mu.Lock()
	storage := b.storage
	b.mu.Unlock()
	if err := b.gather(ctx, storage, dst, &info); err != nil {
		return SampleInfo{}, b.noteFault(err)
	}
	return info, nil
}

// gather copies the rows of a sample b picked (info) from storage into dst
// and checks them (gatherChecked), picking again from b the rows found
// overwritten: all of them for a sampler whose picks repeat (resampleAll).
func (b *Buffer) gather(ctx context.Context, storage, dst *tensordict.TensorDict, info *SampleInfo) error {
	resampled, err := gatherChecked(storage, b.slots, dst, info, b.resampleAll(), func(k int) (SampleInfo, error) {
		var more SampleInfo
		err := b.pick(ctx, k, &more)
		return more, err
	})
	if resampled > 0 {
		b.mu.Lock()
		b.stats.Resampled += int64(resampled)
		b.mu.Unlock()
	}
	return err
}

// resampleAll reports whether a sample that found rows overwritten picks
// the whole sample again rather than those rows: for a sampler that picks
// the first slots of an order and leaves them in (LIFO, MaxHeap, MinHeap;
// selector.Kind.Repeats), a pick of k replacements would be the first k
// again, already in the sample. Not with MaxTimesSampled: a sample is
// then n picks of one, which may repeat a slot, and the rows kept have
// been counted (a slot at its last sample has left the sampler for good).
func (b *Buffer) resampleAll() bool {
	return b.cfg.Sampler.spec.Kind.Repeats() && b.cfg.MaxTimesSampled == 0
}

// overwritten returns which of rows (all of info's when all is set) have a slot
// whose word is no longer the one info recorded: committed, in the
// generation that is the row's ID.
func overwritten(slots *slotTable, info *SampleInfo, rows []int, all bool) []int {
	var out []int
	if all {
		for i, s := range info.Indices {
			if slots.word(s) != makeWord(info.IDs[i], stateCommitted) {
				out = append(out, i)
			}
		}
		return out
	}
	for _, i := range rows {
		if slots.word(info.Indices[i]) != makeWord(info.IDs[i], stateCommitted) {
			out = append(out, i)
		}
	}
	return out
}

// maxResamples bounds how often a sample replaces rows overwritten while it
// copied them, before it gives up with ErrContended.
const maxResamples = 16

// gatherChecked copies the rows info names from storage into dst, then
// checks their words in the slot table; rows whose word changed (a writer
// took the slot while they were copied) are replaced by rows from more,
// and those are checked in turn. With all, any row found changed has every
// row replaced (more of the whole sample), so that a sampler whose picks
// repeat never holds a slot twice (Buffer.resampleAll). info is updated to
// describe what dst holds.
//
// It returns how many rows it found changed.
func gatherChecked(storage *tensordict.TensorDict, slots *slotTable, dst *tensordict.TensorDict, info *SampleInfo,
	all bool, more func(k int) (SampleInfo, error)) (resampled int, err error) {
	if err := storage.GatherInto(dst, info.Indices); err != nil {
		return 0, err
	}
	// A row whose word held after it was copied was copied whole, whatever
	// happens to its slot later: only rows copied since the last check are
	// checked.
	var torn []int // the rows copied again in the last round; nil at first
	for round := range maxResamples {
		fence()
		if torn = overwritten(slots, info, torn, round == 0); len(torn) == 0 {
			return resampled, nil
		}
		resampled += len(torn)
		if all {
			torn = everyRow(torn[:0], len(info.Indices))
		}
		again, err := more(len(torn))
		if err != nil {
			return resampled, err
		}
		rows, err := storage.Gather(again.Indices)
		if err != nil {
			return resampled, err
		}
		if err := dst.SetRows(torn, rows); err != nil {
			return resampled, err
		}
		for j, i := range torn {
			info.Indices[i], info.IDs[i], info.Weights[i] = again.Indices[j], again.IDs[j], again.Weights[j]
		}
	}
	return resampled, fmt.Errorf("%w; %d attempts", ErrContended, maxResamples)
}

// everyRow appends the rows 0 to n-1 to rows.
func everyRow(rows []int, n int) []int {
	for i := range n {
		rows = append(rows, i)
	}
	return rows
}

// pick chooses n committed slots, waiting until the buffer can give them,
// and records them and their words in info.
func (b *Buffer) pick(ctx context.Context, n int, info *SampleInfo) error {
	if err := checkSampleSize(n); err != nil {
		return err
	}
	if err := b.health(false); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.closed.Load() && b.lost == nil && !(b.storage != nil && b.limit.canSample(n, b.sel.Len()) && b.canSelect(n)) {
		if err := b.wait(ctx); err != nil {
			return err
		}
	}
	if b.closed.Load() {
		return ErrClosed
	}
	if b.lost != nil {
		return b.lost
	}
	start := len(info.Indices)
	var err error
	if b.cfg.MaxTimesSampled > 0 {
		info.Indices, info.Weights, err = b.selectCounted(n, info.Indices, info.Weights)
	} else {
		info.Indices, info.Weights, err = b.sel.Select(b.rng, n, info.Indices, info.Weights)
	}
	if err != nil {
		return err
	}
	info.IDs = slices.Grow(info.IDs, n)
	for _, s := range info.Indices[start:] {
		info.IDs = append(info.IDs, gen(b.slots.word(s))) // committed: the sampler holds only those
	}
	if b.cfg.Sampler.spec.Kind.Consumes() {
		for _, s := range info.Indices[start:] {
			b.slots.setPriority(s, consumed)
		}
	}
	b.limit.sampled(n)
	b.broadcast()
	return nil
}

// checkSampleSize checks the size of a sample asked for.
func checkSampleSize(n int) error {
	if n <= 0 {
		return argumentErrorf("batch size must be positive, not %d", n)
	}
	if n > maxSample {
		return argumentErrorf("batch size %d; at most %d in one call", n, maxSample)
	}
	return nil
}

// UpdatePriority sets the priorities of sampled transitions, row by row of
// info (Indices, and IDs when set), and returns how many it updated: a row
// whose slot has been overwritten since it was sampled (its generation is
// no longer the row's ID) is skipped. With IDs nil, the slots are updated whatever they hold.
// Priorities are finite and not negative. Samplers other than Prioritized
// keep the priorities but do not use them.
func (b *Buffer) UpdatePriority(ctx context.Context, info SampleInfo, priorities []float64) (int, error) {
	if err := checkPriorities(priorities, len(info.Indices)); err != nil {
		return 0, err
	}
	if priorities == nil && len(info.Indices) > 0 {
		return 0, schemaErrorf("no priorities")
	}
	if err := b.lockRows(ctx, info); err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	n := 0
	for i, s := range info.Indices {
		w := b.slots.word(s)
		if state(w) != stateCommitted || (info.IDs != nil && gen(w) != info.IDs[i]) {
			continue
		}
		if b.slots.priority(s) == consumed {
			continue
		}
		b.slots.setPriority(s, priorities[i])
		b.selUpdate(s, priorities[i])
		b.maxPrio = max(b.maxPrio, priorities[i])
		n++
	}
	if n > 0 {
		// A row may have become sampleable (a prioritized sampler with
		// eps 0), or a heap's order changed: wake the samples waiting.
		b.broadcast()
	}
	return n, nil
}

// Bounds on one sample, which a remote caller could otherwise make the
// node allocate without limit.
const (
	maxSample      = 1 << rowBits // transitions
	maxSampleBytes = 1 << 30      // bytes of rows, when they are copied out
)
