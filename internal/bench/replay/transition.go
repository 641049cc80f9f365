package replay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The transition every writer writes: a stack of four 84x84 frames, as in
// Atari DQN, and the scalars of one step.
const (
	obsBytes = 84 * 84 * 4

	// TransitionBytes is the size of one transition: obs, action, reward
	// and done, 28,237 bytes. MB/s figures are transitions/s times this.
	TransitionBytes = obsBytes + 8 + 4 + 1
)

// Schema returns the fields of one transition, shapes without the batch
// dimension: obs uint8 [84, 84, 4], action int64, reward float32, done
// bool.
func Schema() tensordict.RowSchema {
	return tensordict.RowSchema{
		{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{84, 84, 4}},
		{Key: []string{"action"}, DType: memmap.Int64},
		{Key: []string{"reward"}, DType: memmap.Float32},
		{Key: []string{"done"}, DType: memmap.Bool},
	}
}

// Every transition carries an id in all its fields, so that whoever
// samples it can tell whether a row is one whole transition. Writer w's
// k-th transition (both counted from 0) has id (w+1)<<idWriterShift | k:
// never 0, so a row that no writer wrote (all zeros) is not a transition.
//
// The fields of transition id:
//
//	action  id, as int64
//	reward  float32(id mod 2^24), exact in a float32
//	done    id is odd
//	obs     the little-endian uint64 at every byte offset in obsChecks holds
//	        obsWord(id, offset); the bytes between them are never read
//
// obsChecks are both ends of the row and every obsStride bytes between, so
// a row whose obs mixes two transitions is caught unless the foreign part
// lies entirely between two checked words (less than obsStride+8 bytes).
const (
	idWriterShift = 40
	obsStride     = 256
)

// obsChecks are the byte offsets of the checked words of an obs row:
// 0, 256, ..., and the last word.
var obsChecks = func() []int {
	var offs []int
	for off := 0; off+8 <= obsBytes; off += obsStride {
		offs = append(offs, off)
	}
	if last := obsBytes - 8; offs[len(offs)-1] != last {
		offs = append(offs, last)
	}
	return offs
}()

// transitionID returns the id of writer's seq-th transition.
func transitionID(writer int, seq uint64) uint64 {
	return uint64(writer+1)<<idWriterShift | seq
}

// obsWord is the word at byte offset off of transition id's obs: the id
// plus a multiple of the offset, so that a word moved within the row is
// caught as well as one from another transition.
func obsWord(id uint64, off int) uint64 { return id + uint64(off)*0x9e3779b97f4a7c15 }

func rewardOf(id uint64) float32 { return float32(id & (1<<24 - 1)) }

func doneOf(id uint64) byte { return byte(id & 1) }

// errTorn is wrapped by verify's errors: a row that is not one whole
// transition.
var errTorn = errors.New("torn row")

// batch is n transitions in Go memory: a TensorDict of the schema and the
// bytes of its leaves, which alias it.
type batch struct {
	td                        *tensordict.TensorDict
	n                         int
	obs, action, reward, done []byte
}

// newBatch returns a zeroed batch of n transitions.
func newBatch(n int) (*batch, error) {
	td, err := tensordict.New(n)
	if err != nil {
		return nil, err
	}
	b := &batch{td: td, n: n}
	leaves := map[string]*[]byte{"obs": &b.obs, "action": &b.action, "reward": &b.reward, "done": &b.done}
	for _, f := range Schema() {
		t, err := tensordict.Zeros(f.DType, append([]int{n}, f.Shape...)...)
		if err != nil {
			return nil, err
		}
		if err := td.SetPath(f.Key, t); err != nil {
			return nil, err
		}
		if *leaves[f.Key[0]], err = t.Bytes(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// stamp makes row i transition id (see idWriterShift): it writes the id
// into every field, and into the checked words of obs.
func (b *batch) stamp(i int, id uint64) {
	row := b.obs[i*obsBytes : (i+1)*obsBytes]
	for _, off := range obsChecks {
		binary.LittleEndian.PutUint64(row[off:], obsWord(id, off))
	}
	binary.LittleEndian.PutUint64(b.action[i*8:], id)
	binary.LittleEndian.PutUint32(b.reward[i*4:], math.Float32bits(rewardOf(id)))
	b.done[i] = doneOf(id)
}

// verify returns the id of the transition row i holds, or an error wrapping
// errTorn that names the first field disagreeing with its action: the row
// mixes transitions, or holds none (no writer's id).
func (b *batch) verify(i int) (uint64, error) {
	id := binary.LittleEndian.Uint64(b.action[i*8:])
	if id>>idWriterShift == 0 {
		return id, fmt.Errorf("%w: row %d holds id %#x, which no writer writes", errTorn, i, id)
	}
	if r := math.Float32frombits(binary.LittleEndian.Uint32(b.reward[i*4:])); r != rewardOf(id) {
		return id, fmt.Errorf("%w: row %d: action %#x but reward %v, want %v", errTorn, i, id, r, rewardOf(id))
	}
	if d := b.done[i]; d != doneOf(id) {
		return id, fmt.Errorf("%w: row %d: action %#x but done byte %d, want %d", errTorn, i, id, d, doneOf(id))
	}
	row := b.obs[i*obsBytes : (i+1)*obsBytes]
	for _, off := range obsChecks {
		if w := binary.LittleEndian.Uint64(row[off:]); w != obsWord(id, off) {
			return id, fmt.Errorf("%w: row %d: action %#x but the obs word at byte %d is transition %#x's",
				errTorn, i, id, off, w-obsWord(0, off))
		}
	}
	return id, nil
}
