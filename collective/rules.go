package collective

import "slices"

// The rules check applies, each a constraint on the ranks' descriptions
// of a call that a row of operations declares. A rule returns the error
// every rank gives, or fills the plan.

// rule is one constraint.
type rule func(ck *checking) error

// checking is a check in progress.
type checking struct {
	ds []desc
	p  *plan
	// holder is the first rank that must pass a tensor, whose description
	// the others' are compared with (set by allTensors or rootTensor).
	holder int
	nd     int  // its tensor's number of dimensions
	dimsOK bool // every tensor has nd dimensions (checked once)
}

// same requires every rank's get to be rank 0's.
func (ck *checking) same(what string, get func(desc) int) error {
	d0 := ck.ds[0]
	for r, d := range ck.ds {
		if get(d) != get(d0) {
			return mismatchf("%v: %s %d on rank %d, %d on rank 0", d0.kind, what, get(d), r, get(d0))
		}
	}
	return nil
}

// ref is the holder's description.
func (ck *checking) ref() desc { return ck.ds[ck.holder] }

// rooted: the root is the same on every rank, and a rank.
func rooted(ck *checking) error {
	p := ck.p
	if err := ck.same("root", func(d desc) int { return d.root }); err != nil {
		return err
	}
	if p.root < 0 || p.root >= len(ck.ds) {
		return argumentf("%v: root %d is not a rank of %d", p.kind, p.root, len(ck.ds))
	}
	return nil
}

// allTensors: every rank passes a tensor, all of one supported dtype.
func allTensors(ck *checking) error {
	holders := make([]int, len(ck.ds))
	for r := range holders {
		holders[r] = r
	}
	return ck.tensors(holders)
}

// rootTensor: the root passes a tensor, of a supported dtype; a tensor
// another rank passes has the same.
func rootTensor(ck *checking) error { return ck.tensors([]int{ck.p.root}) }

func (ck *checking) tensors(holders []int) error {
	p, ds := ck.p, ck.ds
	for _, r := range holders {
		if !ds[r].hasT {
			return argumentf("%v: rank %d passed no tensor", p.kind, r)
		}
	}
	ck.holder = holders[0]
	ref := ck.ref()
	p.dt = ref.dtype
	for r, d := range ds {
		if d.hasT && d.dtype != ref.dtype {
			return mismatchf("%v: rank %d has a %v tensor, rank %d a %v one", p.kind, r, d.dtype.Name(), ck.holder, ref.dtype.Name())
		}
	}
	if !p.dt.Valid() || !Supported(p.dt) {
		return argumentf("%v: dtype %v is not supported", p.kind, p.dt)
	}
	p.esize = p.dt.Size()
	ck.nd = len(ref.shape)
	return nil
}

// reduction: the same reduction on every rank, one that takes the dtype.
func reduction(ck *checking) error {
	p, ds := ck.p, ck.ds
	op := func(d desc) int { return int(d.op) }
	if err := ck.same("operation", op); err != nil {
		return mismatchf("%v: rank %d reduces with %v, rank 0 with %v", p.kind, firstDiff(ds, op), opOf(ds, op), ds[0].op)
	}
	if !p.op.Valid() {
		return argumentf("%v: %v is not a reduction", p.kind, p.op)
	}
	if !p.op.Supports(p.dt) {
		return argumentf("%v: %v does not take %v elements", p.kind, p.op, p.dt.Name())
	}
	return nil
}

// dims requires every tensor to have as many dimensions as the holder's;
// the rules that read shapes call it first.
func (ck *checking) dims() error {
	if ck.dimsOK {
		return nil
	}
	for r, d := range ck.ds {
		if d.hasT && len(d.shape) != ck.nd {
			return mismatchf("%v: rank %d's tensor has %d dimensions, rank %d's %d", ck.p.kind, r, len(d.shape), ck.holder, ck.nd)
		}
	}
	ck.dimsOK = true
	return nil
}

// axisOK requires axis a to be one of the tensors'.
func (ck *checking) axisOK(a int, what string) error {
	if a < 0 || a >= ck.nd {
		return argumentf("%v: %s %d out of range for %d dimensions", ck.p.kind, what, a, ck.nd)
	}
	return nil
}

// onAxis: the same axis on every rank, one of the tensors'.
func onAxis(ck *checking) error {
	if err := ck.dims(); err != nil {
		return err
	}
	if err := ck.same("axis", func(d desc) int { return d.axis }); err != nil {
		return err
	}
	return ck.axisOK(ck.p.axis, "axis")
}

// onAxis2: the same scatter axis on every rank, one of the tensors', not
// the axis (Alltoall).
func onAxis2(ck *checking) error {
	p := ck.p
	if err := ck.dims(); err != nil {
		return err
	}
	if err := ck.same("scatter axis", func(d desc) int { return d.axis2 }); err != nil {
		return err
	}
	if err := ck.axisOK(p.axis2, "scatter axis"); err != nil {
		return err
	}
	if p.axis2 == p.axis {
		return argumentf("%v: the gather and scatter axes are both %d; they must differ", p.kind, p.axis)
	}
	return nil
}

// sameShapes: every tensor passed has the holder's shape.
func sameShapes(ck *checking) error { return ck.shapes(-1) }

// gathered: every tensor has the holder's shape but along the axis, where
// the ranks' sizes go in plan.sizes.
func gathered(ck *checking) error {
	p := ck.p
	if err := ck.shapes(p.axis); err != nil {
		return err
	}
	p.sizes = make([]int, len(ck.ds))
	for r := range p.sizes {
		p.sizes[r] = p.shapes[r][p.axis]
	}
	return nil
}

func (ck *checking) shapes(except int) error {
	if err := ck.dims(); err != nil {
		return err
	}
	ref := ck.ref()
	for r, d := range ck.ds {
		if !d.hasT {
			continue
		}
		for k := range ck.nd {
			if k != except && d.shape[k] != ref.shape[k] {
				return mismatchf("%v: rank %d's tensor has shape %v, rank %d's %v", ck.p.kind, r, d.shape, ck.holder, ref.shape)
			}
		}
	}
	return nil
}

// splitByRoot: the root's counts split the axis (even pieces when it
// gave none); another rank's counts, if given, are the root's.
func splitByRoot(ck *checking) error {
	p := ck.p
	counts := ck.ds[p.root].counts
	for r, d := range ck.ds {
		if r != p.root && d.counts != nil && !slices.Equal(d.counts, counts) {
			return mismatchf("%v: rank %d gave counts %s, the root %s", p.kind, r, intList(d.counts), intList(counts))
		}
	}
	return ck.split(p.axis, counts)
}

// splitAxis: the same counts on every rank split the axis.
func splitAxis(ck *checking) error { return ck.splitShared(ck.p.axis) }

// splitAxis2: the same counts on every rank split the scatter axis.
func splitAxis2(ck *checking) error { return ck.splitShared(ck.p.axis2) }

func (ck *checking) splitShared(axis int) error {
	counts := ck.ds[0].counts
	for r, d := range ck.ds {
		if !slices.Equal(d.counts, counts) {
			return mismatchf("%v: rank %d gave counts %s, rank 0 %s", ck.p.kind, r, intList(d.counts), intList(counts))
		}
	}
	return ck.split(axis, counts)
}

// split checks counts (nil: even) against the length of axis and puts
// them in plan.counts.
func (ck *checking) split(axis int, counts []int) error {
	p, n := ck.p, len(ck.ds)
	length := ck.ref().shape[axis]
	if counts == nil {
		if length%n != 0 {
			return argumentf("%v: axis %d has length %d, which %d ranks cannot split evenly; give counts", p.kind, axis, length, n)
		}
		counts = evenCounts(length, n)
	}
	if len(counts) != n {
		return argumentf("%v: %d counts for %d ranks", p.kind, len(counts), n)
	}
	for _, c := range counts {
		if c < 0 {
			return argumentf("%v: negative count in %s", p.kind, intList(counts))
		}
	}
	total, ok := sumWithin(counts, length)
	if !ok {
		return argumentf("%v: counts %s sum to more than the length %d of axis %d", p.kind, intList(counts), length, axis)
	}
	if total != length {
		return argumentf("%v: counts %s sum to %d, not to the length %d of axis %d", p.kind, intList(counts), total, length, axis)
	}
	p.counts = slices.Clone(counts)
	return nil
}

// sumWithin returns the sum of counts and whether they are all at least 0
// and their sum at most limit. It adds a count only after checking it
// against what is left of limit, so a sum that would wrap around (counts
// MaxInt64, MaxInt64, 6 add up to 4) is refused, not taken for a small
// one: split checks counts with it before any size is computed from
// them, and so does the hierarchy before it reserves room for a Scatter
// or an Alltoall, which multiplies them.
func sumWithin(counts []int, limit int) (int, bool) {
	total := 0
	for _, c := range counts {
		if c < 0 || c > limit-total {
			return total, false
		}
		total += c
	}
	return total, true
}

// splits reports whether counts split length: each at least 0, summing to
// length.
func splits(counts []int, length int) bool {
	total, ok := sumWithin(counts, length)
	return ok && total == length
}

func firstDiff(ds []desc, get func(desc) int) int {
	for r, d := range ds {
		if get(d) != get(ds[0]) {
			return r
		}
	}
	return 0
}

func opOf(ds []desc, get func(desc) int) Op { return Op(get(ds[firstDiff(ds, get)])) }
