package collective

import (
	"context"
	"fmt"
	"slices"
)

// The collectives as data. Each is one row of operations: its wire id
// (kind), its name, the rules check applies to the ranks' descriptions of
// a call (in order), its output shape, and its data phase through the
// shared mappings and over TCP. Each has a file of its own (allreduce.go,
// bcast.go, ...) with the kind, those functions, its calls on Comm and on
// a Tape, and its adjoint; adding a collective is that file and a row
// here. Outside these files only the algorithms that treat some kinds
// apart name them: a hierarchy's levels (hier_ops.go, hier_move.go:
// hierMoves, hierReserve) and the shm pipeline (shm_pipe.go).

// kind is a collective's wire id: the first byte of a desc. A kind is
// never reused.
type kind uint8

// operation is what the package knows of a collective.
type operation struct {
	kind kind
	name string
	// rules are what check verifies of the ranks' descriptions, and fill
	// the plan with, in order (rules.go): rooted before rootTensor, and
	// allTensors or rootTensor before the rules that read the tensors'
	// dtype or shapes.
	rules []rule
	// outShape returns rank r's output shape under p, or nil when it gets
	// none (Gather off the root).
	outShape func(p *plan, r int) []int
	// publish copies what the other ranks read of this rank's input into
	// its data file (shm); it runs only for a rank that passed a tensor
	// and has no bad argument. nil: nothing to publish.
	publish func(s *shmPub) error
	// shm moves the data of a checked plan through the shared mappings.
	shm func(ctx context.Context, s *shmRun) error
	// tcp moves it over TCP.
	tcp func(x *xfer, p *plan, in, out []byte) error
}

// operations lists every collective. Its order is not the wire's: kind is.
var operations = []operation{
	{kind: kindAllreduce, name: "Allreduce", rules: []rule{allTensors, reduction, sameShapes},
		outShape: ownShape, publish: publishReduce, shm: shmReduce, tcp: tcpAllreduce},
	{kind: kindBcast, name: "Bcast", rules: []rule{rooted, rootTensor, sameShapes},
		outShape: bcastShape, publish: publishRoot, shm: shmBcast, tcp: (*xfer).bcast},
	{kind: kindReduce, name: "Reduce", rules: []rule{rooted, allTensors, reduction, sameShapes},
		outShape: ownShape, publish: publishReduce, shm: shmReduce, tcp: tcpReduce},
	{kind: kindGather, name: "Gather", rules: []rule{rooted, allTensors, onAxis, gathered},
		outShape: gatherShape, publish: publishGather, shm: shmGather, tcp: tcpGather},
	{kind: kindAllgather, name: "Allgather", rules: []rule{allTensors, onAxis, gathered},
		outShape: allgatherShape, publish: publishAll, shm: shmGather, tcp: tcpGather},
	{kind: kindScatter, name: "Scatter", rules: []rule{rooted, rootTensor, onAxis, sameShapes, splitByRoot},
		outShape: scatterShape, publish: publishRoot, shm: shmScatter, tcp: (*xfer).scatter},
	{kind: kindAlltoall, name: "Alltoall", rules: []rule{allTensors, onAxis, onAxis2, gathered, splitAxis2},
		outShape: alltoallShape, publish: publishAll, shm: shmAlltoall, tcp: (*xfer).alltoall},
	{kind: kindReduceScatter, name: "ReduceScatter", rules: []rule{allTensors, reduction, onAxis, sameShapes, splitAxis},
		outShape: reduceScatterShape, publish: publishRSPipe, shm: shmReduceScatter, tcp: tcpReduceScatter},
	{kind: kindBarrier, name: "Barrier",
		outShape: noShape, shm: shmNothing, tcp: tcpNothing},
}

// operationOf returns k's row, or nil for a kind this build does not know.
func operationOf(k kind) *operation {
	for i := range operations {
		if operations[i].kind == k {
			return &operations[i]
		}
	}
	return nil
}

func (k kind) String() string {
	if o := operationOf(k); o != nil {
		return o.name
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// outShape returns rank r's output shape, or nil when it gets none (Gather
// off the root).
func (p *plan) outShape(r int) []int { return p.o.outShape(p, r) }

// Output shapes more than one collective has.

func ownShape(p *plan, r int) []int { return p.shapes[r] }
func noShape(*plan, int) []int      { return nil }

// check validates every rank's description of a collective, the same way
// on every rank, and returns the plan they agree on: the checks every
// collective has (the same kind on every rank, no bad argument, a known
// kind), then its row's rules, then the output tensors the Into calls
// gave.
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
	o := operationOf(d0.kind)
	if o == nil {
		return nil, argumentf("%v is not a collective this build knows", d0.kind)
	}
	p := &plan{o: o, kind: d0.kind, op: d0.op, root: d0.root, axis: d0.axis, axis2: d0.axis2, shapes: make([][]int, n)}
	for r, d := range ds {
		if d.hasT {
			p.shapes[r] = d.shape
			if d.shape == nil {
				// A 0-d tensor (FromBytes with a nil shape, or one off the
				// wire): a shape all the same, not "no tensor", which
				// outShape's nil means.
				p.shapes[r] = []int{}
			}
		}
	}
	ck := &checking{ds: ds, p: p}
	for _, rule := range o.rules {
		if err := rule(ck); err != nil {
			return nil, err
		}
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
