package replay

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Trajectories. A buffer whose Config.TrajKey names a field of its schema
// (an int64 per transition, torchrl's traj_key) knows its episodes: every
// committed transition belongs to the episode its field holds, and an
// episode's steps are in the order they were written (their slots' seq:
// the reservation, then the row of its batch). Writers append steps as
// they come, several actors interleaved, one or many steps a batch.
//
// The index lives in memory and is rebuilt from the files at Open: the
// episode of a step is in its row and its order in the slot table, both
// shared mappings, so a node killed by kill -9 mid-episode knows, when
// restarted, every committed step's episode and place.

// episode is one trajectory: its steps by seq. A step whose slot was
// overwritten or deleted is a hole (slot -1), trimmed when at either end;
// a slice never spans one.
type episode struct {
	id    int64
	steps []epStep
	pos   int // its index in episodeIndex.list
}

type epStep struct {
	seq  uint64
	slot int
}

// episodeIndex is a buffer's episodes, by key and in a list (for uniform
// picks), and each slot's episode.
type episodeIndex struct {
	key  []string
	byID map[int64]*episode
	list []*episode
	of   []*episode // per slot; nil: in no episode

	epoch sliceEpoch // slices without replacement
}

func newEpisodeIndex(key []string, capacity int) *episodeIndex {
	return &episodeIndex{key: key, byID: map[int64]*episode{}, of: make([]*episode, capacity)}
}

// checkTrajKey checks that schema has key as an int64 per transition.
func checkTrajKey(schema tensordict.RowSchema, key []string) error {
	for _, f := range schema {
		if slices.Equal(f.Key, key) {
			if f.DType != memmap.Int64 || len(f.Shape) != 0 {
				return fmt.Errorf("the trajectory key %v is %v of shape %v; want one int64 per transition", key, f.DType, f.Shape)
			}
			return nil
		}
	}
	return fmt.Errorf("the trajectory key %v is not in the schema", key)
}

// trajOf reads the trajectory key of the row at slot; b.mu is held and the
// storage known.
func (b *Buffer) trajOf(slot int) (int64, error) {
	t, err := b.storage.Tensor(b.cfg.TrajKey...)
	if err != nil {
		return 0, err
	}
	var buf [8]byte
	if _, err := t.ReadAt(buf[:], int64(slot)*8); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(buf[:])), nil
}

// epAdd puts committed slot s into its episode; b.mu is held. A row whose
// key cannot be read (a fault) stays out of every episode.
func (b *Buffer) epAdd(s int) {
	if b.eps == nil || b.storage == nil {
		return
	}
	id, err := b.trajOf(s)
	if err != nil {
		return
	}
	x := b.eps
	ep := x.byID[id]
	if ep == nil {
		ep = &episode{id: id, pos: len(x.list)}
		x.byID[id] = ep
		x.list = append(x.list, ep)
	}
	st := epStep{seq: b.slots.seq(s), slot: s}
	if n := len(ep.steps); n == 0 || ep.steps[n-1].seq < st.seq {
		ep.steps = append(ep.steps, st)
	} else {
		i, _ := slices.BinarySearchFunc(ep.steps, st.seq, func(e epStep, q uint64) int { return cmpU(e.seq, q) })
		ep.steps = slices.Insert(ep.steps, i, st)
	}
	x.of[s] = ep
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// epRemove takes slot s out of its episode, before its seq changes; b.mu
// is held.
func (b *Buffer) epRemove(s int) {
	if b.eps == nil {
		return
	}
	x := b.eps
	ep := x.of[s]
	if ep == nil {
		return
	}
	x.of[s] = nil
	seq := b.slots.seq(s)
	i, ok := slices.BinarySearchFunc(ep.steps, seq, func(e epStep, q uint64) int { return cmpU(e.seq, q) })
	if ok && ep.steps[i].slot == s {
		ep.steps[i].slot = -1
	}
	lo, hi := 0, len(ep.steps)
	for lo < hi && ep.steps[lo].slot < 0 {
		lo++
	}
	for hi > lo && ep.steps[hi-1].slot < 0 {
		hi--
	}
	ep.steps = ep.steps[lo:hi]
	if len(ep.steps) == 0 {
		last := x.list[len(x.list)-1]
		x.list[ep.pos], last.pos = last, ep.pos
		x.list = x.list[:len(x.list)-1]
		delete(x.byID, ep.id)
		return
	}
	if cap(ep.steps) > 64 && len(ep.steps) < cap(ep.steps)/4 {
		ep.steps = slices.Clone(ep.steps)
	}
}

// rebuildEpisodes indexes every committed slot, in seq order; b.mu is
// held (or the buffer not yet shared).
func (b *Buffer) rebuildEpisodes() {
	if b.eps == nil {
		return
	}
	b.eps = newEpisodeIndex(b.cfg.TrajKey, b.cfg.Capacity)
	if b.storage == nil {
		return
	}
	var committed []int
	for s := range b.cfg.Capacity {
		if state(b.slots.word(s)) == stateCommitted {
			committed = append(committed, s)
		}
	}
	slices.SortFunc(committed, func(p, q int) int { return cmpU(b.slots.seq(p), b.slots.seq(q)) })
	for _, s := range committed {
		b.epAdd(s)
	}
}

// Episode is one trajectory the buffer holds: its key and the slots of its
// steps, in the order they were written; -1 for a step overwritten or
// deleted in the middle of it (a slice never spans one).
type Episode struct {
	ID    int64
	Slots []int
}

// Episodes returns the trajectories the buffer holds now, each with its
// steps' slots in order; nil without a TrajKey. It copies the index: for
// tests and tools, not for a training loop.
func (b *Buffer) Episodes() []Episode {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.eps == nil {
		return nil
	}
	out := make([]Episode, 0, len(b.eps.list))
	for _, ep := range b.eps.list {
		e := Episode{ID: ep.id, Slots: make([]int, len(ep.steps))}
		for i, st := range ep.steps {
			e.Slots[i] = st.slot
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(p, q Episode) int { return cmpU(uint64(p.ID), uint64(q.ID)) })
	return out
}
