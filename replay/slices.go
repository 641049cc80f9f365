package replay

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/tensorwire/tensorwire/replay/internal/selector"
	"github.com/tensorwire/tensorwire/tensordict"
)

// SliceSpec is what SampleSlices samples, with torchrl's SliceSampler's
// meaning: NumSlices slices of SliceLen consecutive steps of one episode
// each, never crossing an episode's boundary.
type SliceSpec struct {
	SliceLen  int `codec:"slice_len"`  // steps in a slice, at least 1
	NumSlices int `codec:"num_slices"` // slices in a sample, at least 1
	// PadShort is torchrl's strict_length=False: an episode shorter than
	// SliceLen may be sampled, whole, its slice padded at the end with
	// zero rows whose Mask is false. Without it (strict_length=True, the
	// default) only episodes of at least SliceLen steps are sampled.
	PadShort bool `codec:"pad_short"`
	// Prioritized is torchrl's PrioritizedSliceSampler: a slice's start
	// step is drawn in proportion to its priority, (p+eps)^alpha, among
	// the steps that can start one, and its rows get the start's
	// importance weight. The buffer's Sampler must be Prioritized (its
	// alpha, beta and eps apply; UpdatePriority sets the steps'
	// priorities).
	Prioritized bool `codec:"prioritized"`
	// WithoutReplacement is torchrl's SliceSamplerWithoutReplacement: in
	// epochs, every step in at most one slice per epoch. An epoch cuts
	// every episode into consecutive slices of SliceLen from its first
	// step (the steps left over at its end in none; an episode shorter
	// than SliceLen is one slice with PadShort) and returns them in a
	// random order; steps written during an epoch join the next one, and
	// a slice whose steps were overwritten since is skipped. A sample that
	// spends an epoch takes the rest of its slices from the next.
	WithoutReplacement bool `codec:"without_replacement"`
}

// SliceInfo describes a sample of slices: row by row (slice after slice,
// each in step order) its slots, generations and weights (SampleInfo; a
// padded row's index is -1), whether each row holds a step (Mask), and
// each slice's episode.
type SliceInfo struct {
	SampleInfo
	Mask     []bool  // per row: false for padding
	Episodes []int64 // per slice: its trajectory key
}

// errNoSlice is a pick that found no slice (never returned: the pick
// waits).
var errNoSlice = fmt.Errorf("replay: no episode holds a slice")

func (s SliceSpec) check(b *Buffer) error {
	if b.eps == nil {
		return argumentErrorf("the buffer has no trajectory key (Config.TrajKey): it knows no episodes to slice")
	}
	if s.Prioritized && s.WithoutReplacement {
		return argumentErrorf("slices prioritized or without replacement, not both")
	}
	if s.Prioritized && b.cfg.Sampler.Kind() != string(selector.KindPrioritized) {
		return argumentErrorf("prioritized slices need a prioritized sampler; the buffer's is %s", b.cfg.Sampler)
	}
	if s.SliceLen <= 0 || s.NumSlices <= 0 {
		return argumentErrorf("slice length %d and number of slices %d; both must be positive", s.SliceLen, s.NumSlices)
	}
	if s.NumSlices > maxSample || s.SliceLen > b.cfg.Capacity || s.SliceLen*s.NumSlices > maxSample {
		return argumentErrorf("%d slices of %d steps: at most %d steps in one call, slices of at most the capacity %d",
			s.NumSlices, s.SliceLen, maxSample, b.cfg.Capacity)
	}
	return nil
}

// SampleSlices samples spec.NumSlices slices of spec.SliceLen consecutive
// steps, each from one episode (torchrl's SliceSampler with slice_len, or
// num_slices with batch_size = NumSlices*SliceLen): an episode is chosen
// uniformly among those holding a slice, then the slice's start uniformly
// within it. It returns a TensorDict of batch size [NumSlices*SliceLen],
// slice after slice, and what it holds. No step is torn: every step is
// checked as a sampled row is, and a slice with a step overwritten while it
// was copied is sampled again, whole. It waits until the buffer holds a
// slice (and the rate limiter allows NumSlices*SliceLen samples), until
// ctx ends. The buffer needs a TrajKey.
func (b *Buffer) SampleSlices(ctx context.Context, spec SliceSpec) (*tensordict.TensorDict, SliceInfo, error) {
	if err := spec.check(b); err != nil {
		return nil, SliceInfo{}, err
	}
	n := spec.SliceLen * spec.NumSlices
	schema, _, err := b.batchSchema(ctx, n, "steps")
	if err != nil {
		return nil, SliceInfo{}, err
	}
	dst, err := schema.Zeros(n)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	info, err := b.sampleSlicesInto(ctx, spec, dst)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	return dst, info, nil
}

// SampleSlicesInto is SampleSlices into dst, a TensorDict with the
// buffer's schema and batch size [NumSlices*SliceLen] (from an earlier
// SampleSlices, say), without allocating it. Padding rows (Mask false) are
// zeroed, as SampleSlices' are.
func (b *Buffer) SampleSlicesInto(ctx context.Context, spec SliceSpec, dst *tensordict.TensorDict) (SliceInfo, error) {
	if err := spec.check(b); err != nil {
		return SliceInfo{}, err
	}
	if err := checkSliceDst(spec, dst); err != nil {
		return SliceInfo{}, err
	}
	return b.sampleSlicesInto(ctx, spec, dst)
}

// checkSliceDst checks that dst has a row for every step of spec's slices.
func checkSliceDst(spec SliceSpec, dst *tensordict.TensorDict) error {
	n, err := batchLen(dst)
	if err != nil {
		return err
	}
	if n != spec.SliceLen*spec.NumSlices {
		return argumentErrorf("a batch of %d rows for %d slices of %d steps", n, spec.NumSlices, spec.SliceLen)
	}
	return nil
}

// sampleSlicesInto is SampleSlices into dst, a batch of the buffer's
// schema of SliceLen*NumSlices rows, spec checked: the node's by bytes
// is one it sent before (sentBatches).
func (b *Buffer) sampleSlicesInto(ctx context.Context, spec SliceSpec, dst *tensordict.TensorDict) (SliceInfo, error) {
	if err := b.enter(); err != nil {
		return SliceInfo{}, err
	}
	defer b.leave()
	var info SliceInfo
	if err := b.pickSlices(ctx, spec, spec.NumSlices, &info); err != nil {
		return SliceInfo{}, err
	}
	b.mu.Lock()
	storage := b.storage
	b.mu.Unlock()
	if err := b.gatherSlices(ctx, storage, spec, dst, &info); err != nil {
		return SliceInfo{}, b.noteFault(err)
	}
	return info, nil
}

// pickSlices appends k slices to info, waiting until the buffer holds
// them.
func (b *Buffer) pickSlices(ctx context.Context, spec SliceSpec, k int, info *SliceInfo) error {
	if err := b.health(false); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	steps := k * spec.SliceLen
	for {
		if b.closed.Load() {
			return ErrClosed
		}
		if b.lost != nil {
			return b.lost
		}
		if b.storage != nil && b.limit.canSample(steps, b.sel.Len()) {
			if err := b.trySlices(spec, k, info); err == nil {
				b.limit.sampled(steps)
				b.broadcast()
				return nil
			}
		}
		if err := b.wait(ctx); err != nil {
			return err
		}
	}
}

// trySlices picks k slices, or none (errNoSlice); b.mu is held.
func (b *Buffer) trySlices(spec SliceSpec, k int, info *SliceInfo) error {
	type pick struct {
		ep     *episode
		start  int
		weight float64
	}
	picks := make([]pick, 0, k)
	L := spec.SliceLen
	info.Indices = slices.Grow(info.Indices, k*L)
	info.IDs = slices.Grow(info.IDs, k*L)
	info.Weights = slices.Grow(info.Weights, k*L)
	info.Mask = slices.Grow(info.Mask, k*L)
	info.Episodes = slices.Grow(info.Episodes, k)
	for range k {
		var ep *episode
		var start int
		ok, w := false, 1.0
		switch {
		case spec.Prioritized:
			ep, start, w, ok = b.slicePickPrioritized(L, spec.PadShort)
		case spec.WithoutReplacement:
			ep, start, ok = b.slicePickEpoch(L, spec.PadShort)
		default:
			ep, start, ok = b.slicePick(L, spec.PadShort)
		}
		if !ok {
			return errNoSlice
		}
		picks = append(picks, pick{ep, start, w})
	}
	for _, p := range picks {
		steps := p.ep.steps[p.start:min(p.start+L, len(p.ep.steps))]
		for _, st := range steps {
			info.Indices = append(info.Indices, st.slot)
			info.IDs = append(info.IDs, gen(b.slots.word(st.slot)))
			info.Weights = append(info.Weights, p.weight)
			info.Mask = append(info.Mask, true)
		}
		for range L - len(steps) {
			info.Indices = append(info.Indices, -1)
			info.IDs = append(info.IDs, 0)
			info.Weights = append(info.Weights, p.weight)
			info.Mask = append(info.Mask, false)
		}
		info.Episodes = append(info.Episodes, p.ep.id)
	}
	return nil
}

// slicePick chooses an episode uniformly, then a start uniformly, and
// rejects a window that holds a hole or (strict) an episode too short;
// after 64 rejections it chooses uniformly among every window there is.
// b.mu is held.
func (b *Buffer) slicePick(L int, pad bool) (*episode, int, bool) {
	list := b.eps.list
	if len(list) == 0 {
		return nil, 0, false
	}
	fits := func(ep *episode, start int) bool {
		end := min(start+L, len(ep.steps))
		for _, st := range ep.steps[start:end] {
			if st.slot < 0 {
				return false
			}
		}
		return true
	}
	for range 64 {
		ep := list[b.rng.IntN(len(list))]
		m := len(ep.steps)
		if m < L {
			if pad && fits(ep, 0) {
				return ep, 0, true
			}
			continue
		}
		if start := b.rng.IntN(m - L + 1); fits(ep, start) {
			return ep, start, true
		}
	}
	// Few episodes hold a slice: count the windows, and take one.
	total := 0
	for _, ep := range list {
		total += windows(ep, L, pad)
	}
	if total == 0 {
		return nil, 0, false
	}
	w := b.rng.IntN(total)
	for _, ep := range list {
		c := windows(ep, L, pad)
		if w >= c {
			w -= c
			continue
		}
		for start := 0; start <= max(len(ep.steps)-L, 0); start++ {
			if fits(ep, start) {
				if w == 0 {
					return ep, start, true
				}
				w--
			}
		}
	}
	return nil, 0, false
}

// sliceEpoch is the slices left in an epoch of slices without
// replacement: each by its episode and its first step's seq.
type sliceEpoch struct {
	L    int
	pad  bool
	left []epochSlice
}

type epochSlice struct {
	ep  *episode
	seq uint64
}

// slicePickEpoch takes the next slice of the epoch, starting a new epoch
// when this one is spent (or was cut for another slice length); b.mu is
// held. A slice whose steps changed since the epoch began is skipped.
func (b *Buffer) slicePickEpoch(L int, pad bool) (*episode, int, bool) {
	e := &b.eps.epoch
	renewed := false
	for {
		if len(e.left) == 0 || e.L != L || e.pad != pad {
			if renewed {
				return nil, 0, false // a new epoch had nothing in it
			}
			b.newEpoch(L, pad)
			renewed = true
		}
		for len(e.left) > 0 {
			c := e.left[len(e.left)-1]
			e.left = e.left[:len(e.left)-1]
			if b.eps.byID[c.ep.id] != c.ep {
				continue // the episode is gone
			}
			i, ok := slices.BinarySearchFunc(c.ep.steps, c.seq, func(e epStep, q uint64) int { return cmpU(e.seq, q) })
			if !ok || c.ep.steps[i].slot < 0 {
				continue
			}
			if _, start, ok := b.canStart(c.ep.steps[i].slot, L, pad); ok && start == i {
				return c.ep, i, true
			}
		}
		if renewed {
			return nil, 0, false
		}
	}
}

// newEpoch cuts every episode into slices of L and shuffles them.
func (b *Buffer) newEpoch(L int, pad bool) {
	e := &b.eps.epoch
	e.L, e.pad, e.left = L, pad, e.left[:0]
	for _, ep := range b.eps.list {
		m := len(ep.steps)
		for i := 0; i < m; i += L {
			if i+L > m && !(pad && i == 0) {
				break
			}
			e.left = append(e.left, epochSlice{ep: ep, seq: ep.steps[i].seq})
		}
	}
	b.rng.Shuffle(len(e.left), func(i, j int) { e.left[i], e.left[j] = e.left[j], e.left[i] })
}

// canStart reports whether slot, a step of an episode, starts a slice of
// L steps without a hole (or, padding, a whole short episode); b.mu is
// held.
func (b *Buffer) canStart(slot, L int, pad bool) (*episode, int, bool) {
	ep := b.eps.of[slot]
	if ep == nil {
		return nil, 0, false
	}
	i, ok := slices.BinarySearchFunc(ep.steps, b.slots.seq(slot), func(e epStep, q uint64) int { return cmpU(e.seq, q) })
	if !ok {
		return nil, 0, false
	}
	m := len(ep.steps)
	if m < L {
		if !pad || i != 0 {
			return nil, 0, false
		}
	} else if i > m-L {
		return nil, 0, false
	}
	for _, st := range ep.steps[i:min(i+L, m)] {
		if st.slot < 0 {
			return nil, 0, false
		}
	}
	return ep, i, true
}

// slicePickPrioritized draws a start step from the prioritized sampler,
// rejecting steps that cannot start a slice: the draw is then in
// proportion to q = (p+eps)^alpha among those that can. After 64
// rejections it draws among every step that can, by a scan, in the same
// proportion: a step the sampler holds with q > 0 counts, priority 0
// included (its q is eps^alpha). b.mu is held.
func (b *Buffer) slicePickPrioritized(L int, pad bool) (*episode, int, float64, bool) {
	var slot []int
	var w []float64
	for range 64 {
		var err error
		slot, w, err = b.sel.Select(b.rng, 1, slot[:0], w[:0])
		if err != nil {
			return nil, 0, 0, false
		}
		if ep, i, ok := b.canStart(slot[0], L, pad); ok {
			return ep, i, w[0], true
		}
	}
	q := b.sel.Mass // what the draws above go by: 0 for a step out of the sampler
	total, qMin := 0.0, math.Inf(1)
	var starts []int
	for _, ep := range b.eps.list {
		for _, st := range ep.steps {
			if st.slot >= 0 && q(st.slot) > 0 {
				if _, _, ok := b.canStart(st.slot, L, pad); ok {
					starts = append(starts, st.slot)
					total += q(st.slot)
					qMin = min(qMin, q(st.slot))
				}
			}
		}
	}
	if len(starts) == 0 || !(total > 0) {
		return nil, 0, 0, false
	}
	x := b.rng.Float64() * total
	for _, s := range starts {
		if x -= q(s); x < 0 || s == starts[len(starts)-1] {
			ep, i, _ := b.canStart(s, L, pad)
			return ep, i, math.Pow(qMin/q(s), b.cfg.Sampler.spec.Beta), true
		}
	}
	return nil, 0, 0, false
}

// windows counts the starts of hole-free slices of L steps in ep (1 for a
// whole short episode when padding).
func windows(ep *episode, L int, pad bool) int {
	m := len(ep.steps)
	if m < L {
		if pad && !slices.ContainsFunc(ep.steps, func(s epStep) bool { return s.slot < 0 }) {
			return 1
		}
		return 0
	}
	run, n := 0, 0
	for _, st := range ep.steps {
		if st.slot < 0 {
			run = 0
			continue
		}
		if run++; run >= L {
			n++
		}
	}
	return n
}

// gatherSlices copies the slices info names from the buffer's storage
// into dst and checks them (gatherSlicesChecked), picking again from the
// buffer the slices found torn.
func (b *Buffer) gatherSlices(ctx context.Context, storage *tensordict.TensorDict, spec SliceSpec, dst *tensordict.TensorDict, info *SliceInfo) error {
	resampled, err := gatherSlicesChecked(storage, b.slots, spec.SliceLen, dst, info, func(k int) (SliceInfo, error) {
		var again SliceInfo
		err := b.pickSlices(ctx, spec, k, &again)
		return again, err
	})
	if resampled > 0 {
		b.mu.Lock()
		b.stats.Resampled += int64(resampled)
		b.mu.Unlock()
	}
	return err
}

// gatherSlicesChecked copies the slices info names (of L rows each) from
// storage into dst, zeroes the padding, and checks every step's word in
// slots; a slice with a torn step is replaced by one from more, copied and
// checked in turn, up to maxResamples rounds. It returns how many slices it
// replaced.
func gatherSlicesChecked(storage *tensordict.TensorDict, slots *slotTable, L int, dst *tensordict.TensorDict, info *SliceInfo,
	more func(k int) (SliceInfo, error)) (resampled int, err error) {
	todo := make([]int, len(info.Episodes)) // the slices to copy and check
	for i := range todo {
		todo[i] = i
	}
	for range maxResamples {
		rows, src, pad := sliceRows(info, todo, L)
		if len(src) == len(info.Indices) { // every row, in order: one copy
			if err := storage.GatherInto(dst, src); err != nil {
				return resampled, err
			}
		} else if len(src) > 0 {
			part, err := storage.Gather(src)
			if err != nil {
				return resampled, err
			}
			if err := dst.SetRows(rows, part); err != nil {
				return resampled, err
			}
		}
		if len(pad) > 0 {
			if err := dst.Fill(pad, 0); err != nil {
				return resampled, err
			}
		}
		fence()
		var torn []int
		for _, sl := range todo {
			for i := sl * L; i < (sl+1)*L; i++ {
				if s := info.Indices[i]; s >= 0 && slots.word(s) != makeWord(info.IDs[i], stateCommitted) {
					torn = append(torn, sl)
					break
				}
			}
		}
		if len(torn) == 0 {
			return resampled, nil
		}
		resampled += len(torn)
		again, err := more(len(torn))
		if err != nil {
			return resampled, err
		}
		for j, sl := range torn {
			copy(info.Indices[sl*L:(sl+1)*L], again.Indices[j*L:(j+1)*L])
			copy(info.IDs[sl*L:(sl+1)*L], again.IDs[j*L:(j+1)*L])
			copy(info.Mask[sl*L:(sl+1)*L], again.Mask[j*L:(j+1)*L])
			copy(info.Weights[sl*L:(sl+1)*L], again.Weights[j*L:(j+1)*L])
			info.Episodes[sl] = again.Episodes[j]
		}
		todo = torn
	}
	return resampled, fmt.Errorf("%w; %d attempts", ErrContended, maxResamples)
}

// sliceRows lists, for the slices todo, the rows of dst that hold steps and
// their slots, and the rows that are padding.
func sliceRows(info *SliceInfo, todo []int, L int) (rows, src, pad []int) {
	rows, src = make([]int, 0, len(todo)*L), make([]int, 0, len(todo)*L)
	for _, sl := range todo {
		for i := sl * L; i < (sl+1)*L; i++ {
			if s := info.Indices[i]; s >= 0 {
				rows, src = append(rows, i), append(src, s)
			} else {
				pad = append(pad, i)
			}
		}
	}
	return rows, src, pad
}
