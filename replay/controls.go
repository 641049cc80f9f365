package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/replay/internal/selector"
)

// LIFO returns the newest transitions and leaves them in (Reverb's Lifo
// selector): a sample of n is the n newest, newest first, all different,
// and waits until the buffer holds n. With Config.MaxTimesSampled 1 it is
// a stack (Reverb's Stack).
func LIFO() Sampler { return Sampler{selector.Spec{Kind: selector.KindLIFO}} }

// MaxHeap returns the transitions of the largest priority (ties: the
// newest) and leaves them in (Reverb's MaxHeap): a sample of n is the n
// first in that order, all different. Priorities come from ExtendPriority
// and UpdatePriority, as for Prioritized; no weights (all 1).
func MaxHeap() Sampler { return Sampler{selector.Spec{Kind: selector.KindMaxHeap}} }

// MinHeap is MaxHeap by the smallest priority (Reverb's MinHeap).
func MinHeap() Sampler { return Sampler{selector.Spec{Kind: selector.KindMinHeap}} }

// selInsert makes slot sampleable; b.mu is held. With MaxTimesSampled its
// count starts at 0.
func (b *Buffer) selInsert(slot int, seq uint64, priority float64) {
	if b.times != nil {
		b.uncount(slot)
		b.times[slot] = 0
	}
	b.sel.Insert(slot, seq, priority)
	b.count(slot)
}

// selRemove makes slot unsampleable; b.mu is held.
func (b *Buffer) selRemove(slot int) {
	if b.times != nil {
		b.uncount(slot)
		b.times[slot] = -1
	}
	b.sel.Remove(slot)
}

// selUpdate sets a sampleable slot's priority; b.mu is held. With
// MaxTimesSampled a slot whose priority makes it pickable, or no longer,
// counts in b.left, or no longer.
func (b *Buffer) selUpdate(slot int, priority float64) {
	b.uncount(slot)
	b.sel.Update(slot, priority)
	b.count(slot)
}

// count adds slot's samples left to b.left, and uncount takes them away,
// if slot is sampleable and can be picked (the sampler's Mass above 0: a
// prioritized slot of priority 0 with eps 0 cannot); b.mu is held. A
// caller changing the slot's sampler state calls uncount before and count
// after. Without MaxTimesSampled both do nothing.
func (b *Buffer) count(slot int) {
	if b.times != nil && b.times[slot] >= 0 && b.sel.Mass(slot) > 0 {
		b.left += int64(b.budget() - b.times[slot])
	}
}

func (b *Buffer) uncount(slot int) {
	if b.times != nil && b.times[slot] >= 0 && b.sel.Mass(slot) > 0 {
		b.left -= int64(b.budget() - b.times[slot])
	}
}

// budget is how many times a slot may be sampled: MaxTimesSampled, or
// once for a sampler that consumes what it returns (FIFO).
func (b *Buffer) budget() int32 {
	if b.cfg.Sampler.spec.Kind.Consumes() {
		return 1
	}
	return int32(b.cfg.MaxTimesSampled)
}

// canSelect reports whether the sampler can give n now; b.mu is held.
// With MaxTimesSampled the slots that can be picked must have n samples
// left between them (b.left): then n picks of one, each taking a sample
// from a pickable slot, all succeed, and otherwise the last fails. Slots
// that cannot be picked (priority 0 with eps 0) do not count, so a sample
// waits rather than take some picks and fail.
func (b *Buffer) canSelect(n int) bool {
	if b.times == nil {
		return b.sel.CanSelect(n)
	}
	return b.left >= int64(n)
}

// selectCounted picks n slots one at a time, as n samples of one (Reverb
// samples so), counting each: a slot sampled MaxTimesSampled times leaves
// the sampler and is marked consumed in the slot table, so that a
// reopened buffer does not return it again. b.mu is held; canSelect(n),
// so every pick succeeds.
func (b *Buffer) selectCounted(n int, slots []int, weights []float64) ([]int, []float64, error) {
	k := b.budget()
	consumes := b.cfg.Sampler.spec.Kind.Consumes()
	for range n {
		var err error
		if slots, weights, err = b.sel.Select(b.rng, 1, slots, weights); err != nil {
			// canSelect(n) rules this out; were b.left wrong, the picks
			// so far would stay counted.
			return slots, weights, fmt.Errorf("replay: %d samples left counted, but: %w", b.left, err)
		}
		s := slots[len(slots)-1]
		b.times[s]++
		b.left--
		if b.times[s] >= k {
			if !consumes {
				b.sel.Remove(s)
			}
			b.times[s] = -1
			b.slots.setPriority(s, consumed)
		}
	}
	return slots, weights, nil
}

// Delete removes transitions from the buffer, row by row of info (Indices,
// and IDs when set, as UpdatePriority reads them): a row whose slot is
// committed, in the generation that is its ID, is emptied and never
// sampled again; the others (overwritten since, deleted already, or out of
// sampling already: consumed by a FIFO sampler or MaxTimesSampled) are
// skipped. It returns how many it deleted. A sample copying a row while
// it is deleted finds the slot's word changed and samples again, as for
// an overwritten row. The writer reuses the slots (top-k: as free slots).
func (b *Buffer) Delete(ctx context.Context, info SampleInfo) (int, error) {
	if err := b.lockRows(ctx, info); err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	n := 0
	for i, s := range info.Indices {
		w := b.slots.word(s)
		if state(w) != stateCommitted || (info.IDs != nil && gen(w) != info.IDs[i]) || b.slots.priority(s) == consumed {
			continue
		}
		b.emptyLocked(s, w)
		n++
	}
	if n > 0 {
		b.broadcast()
	}
	return n, nil
}

// emptyLocked empties committed slot s, whose word is w; b.mu is held.
func (b *Buffer) emptyLocked(s int, w uint64) {
	b.selRemove(s)
	b.epRemove(s)
	b.slots.setWord(s, makeWord(gen(w), stateEmpty))
	b.writer.deleted(s)
}

// Reset empties the buffer (Reverb's reset, torchrl's empty): every
// committed transition is deleted, as Delete does, and the rate limiter's
// counts start again from 0 (saved in MetaFile at once). Reservations in
// flight are kept: their commits land after the reset. Rows are not
// zeroed on disk; their slots are empty and never sampled.
func (b *Buffer) Reset(ctx context.Context) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.leave()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.health(true); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lost != nil {
		return b.lost
	}
	for s := range b.cfg.Capacity {
		if w := b.slots.word(s); state(w) == stateCommitted {
			b.emptyLocked(s, w)
		}
	}
	b.limit.inserts, b.limit.samples = 0, 0
	b.maxPrio = 1
	b.broadcast()
	return b.writeMetaLocked()
}

// controlKeys are the settings of the table controls, after configKeys':
// the rate limiter's ratio, MaxTimesSampled and the writer. writer comes
// before key, which needs a top-k writer.
var controlKeys = []service.Key[Config]{
	{Setting: Setting{Key: "samples-per-insert", Value: "X", Help: "samples per inserted transition the rate limiter keeps (Reverb's SampleToInsertRatio; default 0: no ratio)"},
		Set: func(c *Config, v string) error { return setRatio(&c.Limit.SamplesPerInsert, v) }},
	{Setting: Setting{Key: "error-buffer", Value: "X", Help: "slack around samples-per-insert, in samples"},
		Set: func(c *Config, v string) error { return setRatio(&c.Limit.ErrorBuffer, v) }},
	{Setting: Setting{Key: "max-times-sampled", Value: "N", Help: "a transition leaves after N samples (default 0: never)"},
		Set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > math.MaxInt32 {
				return errors.New("want a whole number, 0 (no limit) or more")
			}
			c.MaxTimesSampled = n
			return nil
		}},
	{Setting: Setting{Key: "writer", Value: "round_robin|top_k", Help: "where new transitions go (default round_robin); top_k needs key=; fixed when the buffer is created"},
		Set: func(c *Config, v string) error {
			switch writerKind(v) {
			case writerRoundRobin:
				c.Writer = RoundRobin()
			case writerTopK:
				if c.Writer.Kind() != string(writerTopK) {
					c.Writer = Writer{writerSpec{Kind: writerTopK}} // key= gives its key
				}
			default:
				return fmt.Errorf("want %s or %s (the kind alone; the top-k key as key=K)", writerRoundRobin, writerTopK)
			}
			return nil
		}},
	{Setting: Setting{Key: "key", Value: "K", Help: "the top-k writer's ranking key, one value per transition (nested keys joined by /)"},
		Set: func(c *Config, v string) error {
			if c.Writer.Kind() != string(writerTopK) {
				return errors.New("the top-k writer's key; give writer=top_k too")
			}
			w, err := ParseWriter("top_k(key=" + v + ")")
			if err != nil {
				return errors.New("want a key, nested keys joined by / (next/reward)")
			}
			c.Writer = w
			return nil
		}},
}

// setRatio sets *dst to v, a finite number >= 0.
func setRatio(dst *float64, v string) error {
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !(x >= 0) || math.IsInf(x, 1) {
		return errors.New("want a finite number >= 0")
	}
	*dst = x
	return nil
}

// trajKey is the trajectory key's setting, after the others.
var trajKey = service.Key[Config]{
	Setting: Setting{Key: "traj-key", Value: "K", Help: "the int64 field holding each transition's episode (torchrl's traj_key; nested keys joined by /): the buffer knows its episodes and samples slices; fixed when it is created"},
	Set: func(c *Config, v string) error {
		key := strings.Split(v, "/")
		if slices.Contains(key, "") {
			return errors.New("want a key, nested keys joined by / (collector/traj_ids)")
		}
		c.TrajKey = key
		return nil
	}}

// lockRows checks the rows info names against the buffer (IDs beside
// Indices, every index in it) and the call's context and files, then
// locks b.mu for a call that changes those rows: on nil the caller holds
// b.mu and unlocks it. A closed buffer is ErrClosed, a lost one its
// ErrStorageLost. Delete and UpdatePriority share it.
func (b *Buffer) lockRows(ctx context.Context, info SampleInfo) error {
	if info.IDs != nil && len(info.IDs) != len(info.Indices) {
		return schemaErrorf("%d ids for %d indices", len(info.IDs), len(info.Indices))
	}
	for i, s := range info.Indices {
		if s < 0 || s >= b.cfg.Capacity {
			return schemaErrorf("index %d is %d; the buffer holds %d", i, s, b.cfg.Capacity)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.health(false); err != nil {
		return err
	}
	b.mu.Lock()
	switch {
	case b.closed.Load():
		b.mu.Unlock()
		return ErrClosed
	case b.lost != nil:
		b.mu.Unlock()
		return b.lost
	}
	return nil
}
