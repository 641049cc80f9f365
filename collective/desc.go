package collective

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/tensorwire/tensorwire/memmap"
)

// Before moving any data, every collective exchanges each rank's
// description of its call (a desc) with every other rank, and every rank
// checks all of them with the same function (check). So a bad argument
// or a disagreement between ranks gives every rank the same error, not a
// hang, and the data phase runs only when its pattern is agreed on.

// kind names a collective.
type kind uint8

const (
	kindAllreduce kind = iota + 1
	kindBcast
	kindReduce
	kindGather
	kindAllgather
	kindScatter
	kindAlltoall
	kindReduceScatter
	kindBarrier
	numKinds
)

var kindNames = [numKinds]string{"invalid", "Allreduce", "Bcast", "Reduce", "Gather", "Allgather", "Scatter", "Alltoall", "ReduceScatter", "Barrier"}

func (k kind) String() string {
	if k == 0 || k >= numKinds {
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
	return kindNames[k]
}

// desc is one rank's description of its call.
type desc struct {
	kind   kind
	op     Op
	dtype  memmap.DType
	root   int
	axis   int
	axis2  int
	hasT   bool  // the rank passed a tensor
	shape  []int // its shape
	counts []int // nil: none given
	bad    string
	// noSpace: bad is a failure to reserve room in the shared folder
	// (ErrNoSpace), not a bad argument.
	noSpace bool
	hasOut  bool // the rank gave an output tensor (the Into calls)
	outDT   memmap.DType
	out     []int // its shape
}

func (d *desc) encode(b []byte) []byte {
	flags := byte(0)
	if d.hasT {
		flags |= 1
	}
	if d.counts != nil {
		flags |= 2
	}
	if d.hasOut {
		flags |= 4
	}
	if d.noSpace {
		flags |= 8
	}
	b = append(b, byte(d.kind), byte(d.op), byte(d.dtype), flags, byte(d.outDT))
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(d.root)))
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(d.axis)))
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(d.axis2)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(d.shape)))
	for _, s := range d.shape {
		b = binary.LittleEndian.AppendUint64(b, uint64(s))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(d.counts)))
	for _, c := range d.counts {
		b = binary.LittleEndian.AppendUint64(b, uint64(int64(c)))
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(d.out)))
	for _, s := range d.out {
		b = binary.LittleEndian.AppendUint64(b, uint64(s))
	}
	bad := d.bad
	if len(bad) > 1024 {
		bad = bad[:1024]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(bad)))
	return append(b, bad...)
}

var errShortDesc = errors.New("collective: short description")

func decodeDesc(b []byte) (desc, error) {
	var d desc
	if len(b) < 19 {
		return d, errShortDesc
	}
	d.kind, d.op, d.dtype = kind(b[0]), Op(b[1]), memmap.DType(b[2])
	d.hasT = b[3]&1 != 0
	hasCounts := b[3]&2 != 0
	d.hasOut = b[3]&4 != 0
	d.noSpace = b[3]&8 != 0
	d.outDT = memmap.DType(b[4])
	b = b[1:]
	d.root = int(int32(binary.LittleEndian.Uint32(b[4:])))
	d.axis = int(int32(binary.LittleEndian.Uint32(b[8:])))
	d.axis2 = int(int32(binary.LittleEndian.Uint32(b[12:])))
	nd := int(binary.LittleEndian.Uint16(b[16:]))
	b = b[18:]
	if len(b) < nd*8+4 {
		return d, errShortDesc
	}
	d.shape = make([]int, nd)
	for i := range d.shape {
		d.shape[i] = int(binary.LittleEndian.Uint64(b[i*8:]))
	}
	b = b[nd*8:]
	nc := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	if len(b) < nc*8+2 {
		return d, errShortDesc
	}
	if hasCounts {
		d.counts = make([]int, nc)
		for i := range d.counts {
			d.counts[i] = int(int64(binary.LittleEndian.Uint64(b[i*8:])))
		}
	}
	b = b[nc*8:]
	no := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	if len(b) < no*8+2 {
		return d, errShortDesc
	}
	d.out = make([]int, no)
	for i := range d.out {
		d.out[i] = int(binary.LittleEndian.Uint64(b[i*8:]))
	}
	b = b[no*8:]
	nb := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+nb {
		return d, errShortDesc
	}
	d.bad = string(b[2 : 2+nb])
	return d, nil
}

// plan is a collective as every rank agreed on it.
type plan struct {
	kind   kind
	op     Op
	dt     memmap.DType
	esize  int
	root   int
	axis   int
	axis2  int
	shapes [][]int // each rank's input shape; nil where it passed none
	counts []int   // Scatter, ReduceScatter, Alltoall: the pieces' sizes along the split axis
	sizes  []int   // Gather, Allgather, Alltoall: each rank's size along the gathered axis
}

// outShape returns rank r's output shape, or nil when it gets none (Gather
// off the root).
func (p *plan) outShape(r int) []int {
	switch p.kind {
	case kindAllreduce, kindReduce:
		return p.shapes[r]
	case kindBcast:
		return p.shapes[p.root]
	case kindGather:
		if r != p.root {
			return nil
		}
		return along(p.shapes[r], p.axis, sum(p.sizes))
	case kindAllgather:
		return along(p.shapes[r], p.axis, sum(p.sizes))
	case kindScatter:
		return along(p.shapes[p.root], p.axis, p.counts[r])
	case kindReduceScatter:
		return along(p.shapes[r], p.axis, p.counts[r])
	case kindAlltoall:
		s := along(p.shapes[r], p.axis2, p.counts[r])
		s[p.axis] = sum(p.sizes)
		return s
	}
	return nil
}

// bytes returns the size of rank r's input in bytes.
func (p *plan) bytes(r int) int {
	if p.shapes[r] == nil {
		return 0
	}
	return numel(p.shapes[r]) * p.esize
}

func sum(s []int) int {
	t := 0
	for _, v := range s {
		t += v
	}
	return t
}

// check validates every rank's description of a collective, the same way
// on every rank, and returns the plan they agree on.
func check(ds []desc) (*plan, error) {
	n := len(ds)
	d0 := ds[0]
	for r, d := range ds {
		if d.kind != d0.kind {
			return nil, mismatchf("rank %d called %v while rank 0 called %v", r, d.kind, d0.kind)
		}
	}
	for r, d := range ds {
		if d.bad != "" && d.noSpace {
			return nil, errorf(ErrNoSpace, "%v on rank %d: %s", d.kind, r, d.bad)
		}
		if d.bad != "" {
			return nil, argumentf("%v on rank %d: %s", d.kind, r, d.bad)
		}
	}
	p := &plan{kind: d0.kind, op: d0.op, root: d0.root, axis: d0.axis, axis2: d0.axis2, shapes: make([][]int, n)}
	for r, d := range ds {
		if d.hasT {
			p.shapes[r] = d.shape
		}
	}
	same := func(what string, get func(desc) int) error {
		for r, d := range ds {
			if get(d) != get(d0) {
				return mismatchf("%v: %s %d on rank %d, %d on rank 0", d0.kind, what, get(d), r, get(d0))
			}
		}
		return nil
	}
	if p.kind == kindBarrier {
		return p, nil
	}
	// The root.
	switch p.kind {
	case kindBcast, kindReduce, kindGather, kindScatter:
		if err := same("root", func(d desc) int { return d.root }); err != nil {
			return nil, err
		}
		if p.root < 0 || p.root >= n {
			return nil, argumentf("%v: root %d is not a rank of %d", p.kind, p.root, n)
		}
	}
	// The tensors: who must pass one, and their dtypes.
	holders := []int{}
	switch p.kind {
	case kindBcast, kindScatter:
		holders = []int{p.root}
	default:
		for r := range n {
			holders = append(holders, r)
		}
	}
	for _, r := range holders {
		if !ds[r].hasT {
			return nil, argumentf("%v: rank %d passed no tensor", p.kind, r)
		}
	}
	ref := ds[holders[0]]
	p.dt = ref.dtype
	for r, d := range ds {
		if d.hasT && d.dtype != ref.dtype {
			return nil, mismatchf("%v: rank %d has a %v tensor, rank %d a %v one", p.kind, r, d.dtype.Name(), holders[0], ref.dtype.Name())
		}
	}
	if !p.dt.Valid() || !Supported(p.dt) {
		return nil, argumentf("%v: dtype %v is not supported", p.kind, p.dt)
	}
	p.esize = p.dt.Size()
	// The reduction.
	switch p.kind {
	case kindAllreduce, kindReduce, kindReduceScatter:
		if err := same("operation", func(d desc) int { return int(d.op) }); err != nil {
			return nil, mismatchf("%v: rank %d reduces with %v, rank 0 with %v", p.kind, firstDiff(ds, func(d desc) int { return int(d.op) }), opOf(ds, func(d desc) int { return int(d.op) }), d0.op)
		}
		if !p.op.Valid() {
			return nil, argumentf("%v: %v is not a reduction", p.kind, p.op)
		}
		if !p.op.Supports(p.dt) {
			return nil, argumentf("%v: %v does not take %v elements", p.kind, p.op, p.dt.Name())
		}
	}
	// The axes.
	nd := len(ref.shape)
	for r, d := range ds {
		if d.hasT && len(d.shape) != nd {
			return nil, mismatchf("%v: rank %d's tensor has %d dimensions, rank %d's %d", p.kind, r, len(d.shape), holders[0], nd)
		}
	}
	axisOK := func(a int, what string) error {
		if a < 0 || a >= nd {
			return argumentf("%v: %s %d out of range for %d dimensions", p.kind, what, a, nd)
		}
		return nil
	}
	switch p.kind {
	case kindGather, kindAllgather, kindScatter, kindReduceScatter, kindAlltoall:
		if err := same("axis", func(d desc) int { return d.axis }); err != nil {
			return nil, err
		}
		if err := axisOK(p.axis, "axis"); err != nil {
			return nil, err
		}
	}
	if p.kind == kindAlltoall {
		if err := same("scatter axis", func(d desc) int { return d.axis2 }); err != nil {
			return nil, err
		}
		if err := axisOK(p.axis2, "scatter axis"); err != nil {
			return nil, err
		}
		if p.axis2 == p.axis {
			return nil, argumentf("Alltoall: the gather and scatter axes are both %d; they must differ", p.axis)
		}
	}
	// The shapes: equal, but along the gathered axis.
	except := -1
	switch p.kind {
	case kindGather, kindAllgather, kindAlltoall:
		except = p.axis
	}
	for r, d := range ds {
		if !d.hasT {
			continue
		}
		for k := range nd {
			if k != except && d.shape[k] != ref.shape[k] {
				return nil, mismatchf("%v: rank %d's tensor has shape %v, rank %d's %v", p.kind, r, d.shape, holders[0], ref.shape)
			}
		}
	}
	switch p.kind {
	case kindGather, kindAllgather, kindAlltoall:
		p.sizes = make([]int, n)
		for r := range n {
			p.sizes[r] = p.shapes[r][p.axis]
		}
	}
	// The counts of a split.
	split := -1
	var counts []int
	switch p.kind {
	case kindScatter:
		split, counts = p.axis, ds[p.root].counts
		for r, d := range ds {
			if r != p.root && d.counts != nil && !slices.Equal(d.counts, counts) {
				return nil, mismatchf("Scatter: rank %d gave counts %s, the root %s", r, intList(d.counts), intList(counts))
			}
		}
	case kindReduceScatter, kindAlltoall:
		split, counts = p.axis, d0.counts
		if p.kind == kindAlltoall {
			split = p.axis2
		}
		for r, d := range ds {
			if !slices.Equal(d.counts, counts) {
				return nil, mismatchf("%v: rank %d gave counts %s, rank 0 %s", p.kind, r, intList(d.counts), intList(counts))
			}
		}
	}
	if split >= 0 {
		length := ref.shape[split]
		if counts == nil {
			if length%n != 0 {
				return nil, argumentf("%v: axis %d has length %d, which %d ranks cannot split evenly; give counts", p.kind, split, length, n)
			}
			counts = evenCounts(length, n)
		}
		if len(counts) != n {
			return nil, argumentf("%v: %d counts for %d ranks", p.kind, len(counts), n)
		}
		for _, c := range counts {
			if c < 0 {
				return nil, argumentf("%v: negative count in %s", p.kind, intList(counts))
			}
		}
		if sum(counts) != length {
			return nil, argumentf("%v: counts %s sum to %d, not to the length %d of axis %d", p.kind, intList(counts), sum(counts), length, split)
		}
		p.counts = slices.Clone(counts)
	}
	// The output tensors given (the Into calls).
	for r, d := range ds {
		if !d.hasOut {
			continue
		}
		want := p.outShape(r)
		if want == nil {
			continue // Gather off the root: nothing comes out
		}
		if d.outDT != p.dt || !slices.Equal(d.out, want) {
			return nil, argumentf("%v: rank %d's output is %v %v, the result is %v %v", p.kind, r, d.outDT.Name(), d.out, p.dt.Name(), want)
		}
	}
	return p, nil
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
