package collective

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tensorwire/tensorwire/memmap"
)

// Before moving any data, every collective exchanges each rank's
// description of its call (a desc) with every other rank, and every rank
// checks all of them with the same function (check). So a bad argument
// or a disagreement between ranks gives every rank the same error, not a
// hang, and the data phase runs only when its pattern is agreed on.

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

// descMax is the most bytes a description's encoding takes: the room for
// one in a rank's control file (shared mappings). Every transport holds
// descriptions to it (seal), so that a call fails alike on each.
const descMax = 64 << 10

// badMax is the most bytes of a description's bad that go on the wire.
const badMax = 1024

// seal returns d's encoding, having made d one that every rank decodes as
// this rank holds it. The encoding holds the root and axes as int32, a
// shape's length as uint16, and takes at most descMax bytes: a
// description that does not fit (a root of 1<<32; thousands of dimensions
// or counts) would read otherwise on the other ranks, whose checks would
// then disagree with this rank's (one rank failing the call, another
// waiting for its data), or overflow its room in the control file. Such a
// description becomes a bad one saying why (ErrArgument on every rank),
// keeping only its kind, op and dtype; bad itself is cut to badMax bytes,
// as on the wire. Every transport sends descriptions sealed and checks
// its own as sealed. It costs a few comparisons a call.
func (d *desc) seal() []byte {
	if why := d.misfit(); why != "" {
		bad, noSpace := d.bad, d.noSpace
		if bad == "" {
			bad, noSpace = why, false
		}
		*d = desc{kind: d.kind, op: d.op, dtype: d.dtype, bad: bad, noSpace: noSpace}
	}
	if len(d.bad) > badMax {
		d.bad = d.bad[:badMax]
	}
	return d.encode(nil)
}

// misfit says why d cannot go on the wire as it is; "" when it can.
func (d *desc) misfit() string {
	for _, a := range [...]struct {
		name string
		v    int
	}{{"root", d.root}, {"axis", d.axis}, {"axis", d.axis2}} {
		if a.v != int(int32(a.v)) {
			return fmt.Sprintf("%s %d is out of range", a.name, a.v)
		}
	}
	// The fixed fields, 8 bytes a dimension or count, and room for bad
	// (set later where publishing fails).
	if n := 27 + 8*(len(d.shape)+len(d.counts)+len(d.out)) + badMax; n > descMax {
		return fmt.Sprintf("the call's description takes more than %d bytes (a tensor of %d dimensions, %d counts, an output of %d dimensions)",
			descMax, len(d.shape), len(d.counts), len(d.out))
	}
	return ""
}

// encode appends d's encoding to b as it is; seal makes sure it fits.
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
	if len(bad) > badMax {
		bad = bad[:badMax]
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
	o      *operation // kind's row
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
