package serve

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The serve.replica message stream: a process attaches to a served model
// as one of its replicas (attach.go), a Python process holding a
// torch.nn.Module, say (python/tensorwire/replica.py). docs/serve.md,
// "Replicas in other processes", describes the messages.
//
// The replica opens the stream with a replicaRequest naming the model,
// the batches it takes in flight (Window: 0 or 1, one at a time, as
// replicas before it did; the node keeps min(Window, maxWindow) in
// flight) and, when it shares the node's page cache (rpc.Coherent), the
// folder under the root holding its input and output rows: a client's
// folder (ClientsDir/ID: in, out, lock), Window*MaxBatch rows each (the
// rows of lane k are [k*MaxBatch, (k+1)*MaxBatch)). The node then sends a
// replicaBatch per batch, up to Window before the first is answered, and
// the replica answers each, in the order it was sent, with a
// replicaAnswer:
//
//   - by reference (a folder), the node copies the batch's rows into the
//     folder's in rows [row, row+n) before it sends (batch, n, row), and
//     the replica writes its outputs into out rows [row, row+n) before it
//     answers: no row travels on the stream;
//   - by bytes (no folder), the rows travel as TDs after the messages'
//     headers (rpc's bytes mode), in the batch's In and the answer's Out;
//     row is 0.
//
// A replica by reference may also ask for a lane (Lane): the batches and
// answers then go as fixed frames through two FIFOs in its folder, and
// the stream carries only the node's laneAck and its end (lane.go).
//
// A window lets the replica read its next batch while the node takes its
// answer to the last: the batch waits in the stream rather than behind a
// round trip. On the node the replica is Window lanes (attach.go), each
// taking batches as a replica does.
//
// An answer with an error (the module raised, its outputs did not fit
// the output schema) fails the batch with ErrForward carrying the
// message, and the node ends the stream with that error; an answer later
// than Config.ReplicaTimeout after its batch was sent ends it too, and the
// batch runs elsewhere, as it does when the stream breaks. Every other
// batch the replica held then runs elsewhere too. The process may open
// another stream.

// MethodReplica is the message stream a replica in another process attaches
// by.
const MethodReplica = "serve.replica"

type (
	// replicaRequest opens serve.replica.
	replicaRequest struct {
		Name   string `codec:"name"`
		Prefix string `codec:"prefix"`         // the replica's folder under the root (by reference); "": rows as bytes
		Window int    `codec:"window"`         // batches it takes in flight; 0 (a replica before windows) or 1: one at a time
		Lane   bool   `codec:"lane,omitempty"` // by reference: its folder has the FIFOs of a lane (lane.go)
	}
	// replicaBatch is a batch for the replica (node to replica).
	replicaBatch struct {
		Batch uint64  `codec:"batch"` // 1, 2, ... on this stream
		In    *rpc.TD `codec:"in"`    // bytes mode: the rows; by reference: nil, they are in the folder's in rows [row, row+n)
		N     int     `codec:"n"`     // rows
		Row   int     `codec:"row"`   // by reference: its first row in the folder's in and out (a multiple of MaxBatch); bytes: 0
	}
	// replicaAnswer is the replica's answer to a batch (replica to node).
	replicaAnswer struct {
		Batch   uint64  `codec:"batch"`   // the batch's
		Version uint64  `codec:"version"` // the parameter version that computed it
		Error   string  `codec:"error"`   // "": outputs; else why there are none (the module raised)
		Out     *rpc.TD `codec:"out"`     // bytes mode: the outputs; by reference: nil, they are in the folder's out rows [0, n)
	}
)

// maxWindow bounds the batches the node keeps in flight to one attached
// replica (replicaRequest.Window).
const maxWindow = 4

// attachedStream is the node's end of one serve.replica stream.
type attachedStream struct {
	m      *Manager
	st     *rpc.ServerStream[replicaAnswer, replicaBatch]
	window int           // its lanes
	done   chan struct{} // closed by stop
	once   sync.Once
	err    error // stop's cause
	lost   bool  // stopped because one of its batches failed: the others go elsewhere

	pmu     sync.Mutex     // pending
	pending []pendingBatch // the batches sent and not answered, in the order sent

	mu      sync.Mutex // the mappings, while a batch's rows are copied in or out
	smu     sync.Mutex // the sending of batches: their numbers and pending, in the order sent
	closed  bool
	in, out *tensordict.TensorDict // by reference: the replica's rows (window*MaxBatch); nil: bytes
	lane    *lane                  // by reference, when the replica asked for one and the node opened it
	inF     fields
	outF    fields
	next    uint64
}

// pendingBatch is a batch sent to the replica, waiting for its answer.
type pendingBatch struct {
	batch  uint64
	answer chan replicaAnswer // 1: the reader's
}

// gone is the error of a batch given to the replica, or waiting for its
// answer, after its stream was stopped: stop's cause when the manager
// closed or for a failure of the replica's own (it answered out of turn),
// else errGone (its process went away, or another of its batches failed
// and it was detached): the batch runs elsewhere.
func (a *attachedStream) gone() error {
	if a.err != nil && !a.lost {
		return a.err
	}
	if a.err != nil {
		return fmt.Errorf("%w: %w: it was detached for another batch: %v", ErrForward, errGone, a.err)
	}
	return fmt.Errorf("%w: %w: its stream ended", ErrForward, errGone)
}

// stop ends the stream with err (the handler returns it); lost: err is a
// batch's, and the replica's other batches go elsewhere.
func (a *attachedStream) stop(err error, lost bool) {
	a.once.Do(func() {
		a.err, a.lost = err, lost
		close(a.done)
	})
}

func (svc *Service) replica(ctx context.Context, req replicaRequest, st *rpc.ServerStream[replicaAnswer, replicaBatch]) error {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return err
	}
	a := &attachedStream{m: s.m, st: st, window: min(max(req.Window, 1), maxWindow), done: make(chan struct{})}
	if req.Prefix != "" {
		if err := svc.mapReplica(ctx, s.m, req.Prefix, req.Lane, a); err != nil {
			return err
		}
	}
	defer func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.closed = true
		if a.in != nil {
			a.in.Close()
			a.out.Close()
		}
		if a.lane != nil {
			a.lane.close()
		}
	}()
	if a.lane != nil {
		if err := st.Send(ctx, laneAck); err != nil {
			return err
		}
		go a.readLane(ctx)
	}
	go a.read(ctx)
	lanes := make([]forwardFunc, a.window)
	for k := range lanes {
		row := k * s.m.cfg.MaxBatch
		lanes[k] = func(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error) {
			return a.forward(ctx, row, in)
		}
	}
	r, err := s.m.attach(lanes)
	if err != nil {
		return err
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		a.stop(a.endCause(ctx, ctx.Err()), false)
	case <-s.m.ctx.Done(): // the manager closed
		a.stop(ErrStopped, false)
	}
	s.m.detach(r, a.err)
	if a.err != nil && ctx.Err() == nil {
		return a.err
	}
	return nil
}

// mapReplica maps the replica's rows: its folder's in and out,
// a.window*MaxBatch rows of the model's schemas, as a client's slots are
// mapped.
//
// With lane, it also opens the folder's lane (lane.go); a lane it cannot
// open is logged and left: the batches go on the stream.
func (svc *Service) mapReplica(ctx context.Context, m *Manager, prefix string, lane bool, a *attachedStream) error {
	if err := rpc.RequireCoherent(ctx, "serve: a replica's rows in a shared folder"); err != nil {
		return err
	}
	switch {
	case svc.rootFS == nil:
		return rpc.Errorf(rpc.FailedPrecondition, "serve: this node has no shared root: the replica must take its rows as bytes")
	case !clientDirRE.MatchString(prefix):
		return schemaErrorf("replica folder %q; want %s/ and 16 hexadecimal digits", prefix, ClientsDir)
	}
	cr, err := openPath(svc.rootFS, prefix)
	if err != nil {
		return schemaErrorf("the replica's folder: %v", err)
	}
	defer cr.Close()
	dir := filepath.Join(svc.root, filepath.FromSlash(prefix))
	rows := a.window * m.cfg.MaxBatch
	in, err := svc.mapClient(cr, filepath.Join(dir, "in"), m.cfg.Input, rows, "input")
	if err != nil {
		return err
	}
	out, err := svc.mapClient(cr, filepath.Join(dir, "out"), m.cfg.Output, rows, "output")
	if err != nil {
		in.Close()
		return err
	}
	if a.inF, err = fieldsOf(in, m.cfg.Input); err == nil {
		a.outF, err = fieldsOf(out, m.cfg.Output)
	}
	if err != nil {
		in.Close()
		out.Close()
		return err
	}
	a.in, a.out = in, out
	if lane {
		if a.lane, err = openLane(cr); err != nil {
			m.log.Warn("serve: a replica's lane could not be opened; its batches go on its stream", "folder", prefix, "err", err)
		}
	}
	return nil
}

// read receives the replica's answers until the stream ends, and stops it
// then (the replica went away, or closed its side). Each answers the
// oldest batch pending.
func (a *attachedStream) read(ctx context.Context) {
	for {
		ans, err := a.st.Recv(ctx)
		if err != nil {
			a.stop(a.endCause(ctx, err), false)
			return
		}
		if a.lane != nil {
			a.stop(fmt.Errorf("%w: the replica answered on its stream; it took a lane, where its answers go", ErrForward), false)
			return
		}
		if ans.Out != nil && ans.Out.TensorDict != nil && anyMapped(ans.Out.TensorDict) {
			// A reference is valid only until the next Recv, and the
			// batch's outputs outlive it.
			a.stop(fmt.Errorf("%w: the replica sent its outputs by reference; send them as bytes, or write them into its folder's out rows", ErrForward), false)
			return
		}
		if !a.deliver(ans) {
			return
		}
	}
}

// readLane receives the replica's answers from its lane until it ends,
// and stops the stream then: as read does, the end of the lane being the
// replica's leaving (its process went away, or it closed the lane).
func (a *attachedStream) readLane(ctx context.Context) {
	for {
		ans, err := a.lane.recv()
		if err != nil {
			if !errors.Is(err, errLaneClosed) {
				err = fmt.Errorf("%w: %w", ErrForward, err)
			}
			a.stop(a.endCause(ctx, err), false)
			return
		}
		if !a.deliver(ans) {
			return
		}
	}
}

// deliver hands ans to the oldest batch pending, whose answer it must be;
// false (the stream stopped) when it is not.
func (a *attachedStream) deliver(ans replicaAnswer) bool {
	a.pmu.Lock()
	var p pendingBatch
	ok := len(a.pending) > 0 && a.pending[0].batch == ans.Batch
	if ok {
		p, a.pending = a.pending[0], a.pending[1:]
	}
	a.pmu.Unlock()
	if !ok {
		a.stop(fmt.Errorf("%w: the replica answered batch %d, which it was not given or not next (serve.replica answers in the order sent)", ErrForward, ans.Batch), false)
		return false
	}
	p.answer <- ans // its only send: never blocks
	return true
}

// endCause is what the end of the replica's stream (Recv's err) says of
// it: nil when the replica left in good order (it cancelled its stream or
// went away, the handler's ctx ended: the same thing the handler sees)
// with no batch pending; else the fault the manager logs it detached for.
// The handler's wait and read race on a replica's leaving, and must agree.
func (a *attachedStream) endCause(ctx context.Context, err error) error {
	a.pmu.Lock()
	pending := len(a.pending)
	a.pmu.Unlock()
	left := ctx.Err() != nil || errors.Is(err, rpc.ErrCanceled) || errors.Is(err, errLaneClosed)
	switch {
	case left && pending == 0:
		return nil
	case left:
		return fmt.Errorf("%w: %w with %d batch(es) unanswered", ErrForward, errGone, pending)
	}
	return fmt.Errorf("%w: %w: its stream ended: %v", ErrForward, errGone, err) // %v: not the stream's code
}

// anyMapped reports whether a tensor of td is a mapping.
func anyMapped(td *tensordict.TensorDict) bool {
	for _, t := range td.Leaves() {
		if t.Mapped() {
			return true
		}
	}
	return false
}

// putRows puts the batch's rows where the replica reads them: its in rows
// from row (by reference), or msg's In.
func (a *attachedStream) putRows(row, n int, in *tensordict.TensorDict, msg *replicaBatch) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("%w: %w: its stream ended", ErrForward, errGone)
	}
	if a.in == nil {
		msg.In = &rpc.TD{TensorDict: in}
		return nil
	}
	msg.Row = row
	src, err := fieldsOf(in, a.m.cfg.Input)
	if err == nil {
		err = copyRows(a.inF, row, src, 0, n)
	}
	if err != nil {
		return fmt.Errorf("%w: %w: its input rows: %v", ErrForward, errGone, err)
	}
	return nil
}

// forward runs the batch in on the replica, in its rows from row (by
// reference): a lane's forward.
func (a *attachedStream) forward(ctx context.Context, row int, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error) {
	out, v, err := a.exchange(ctx, row, in)
	if err != nil {
		// The manager detaches it, its other batches going elsewhere;
		// unless the manager is closing, when they end with it.
		a.stop(err, !errors.Is(err, ErrStopped))
	}
	return out, v, err
}

func (a *attachedStream) exchange(ctx context.Context, row int, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error) {
	n := in.BatchSize()[0]
	p, err := a.send(ctx, row, n, in)
	if err != nil {
		return nil, 0, err
	}
	deadline := time.NewTimer(a.m.cfg.ReplicaTimeout)
	defer deadline.Stop()
	var ans replicaAnswer
	select {
	case ans = <-p.answer:
	case <-a.done:
		return nil, 0, a.gone()
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("%w: %v", ErrStopped, ctx.Err())
	case <-deadline.C:
		return nil, 0, fmt.Errorf("%w: %w: no answer within %v (Config.ReplicaTimeout): detached", ErrForward, errGone, a.m.cfg.ReplicaTimeout)
	}
	if ans.Error != "" {
		return nil, 0, fmt.Errorf("%w: the attached replica failed: %s", ErrForward, ans.Error)
	}
	if a.out == nil {
		if ans.Out == nil || ans.Out.TensorDict == nil {
			return nil, 0, fmt.Errorf("%w: the replica answered without outputs", ErrForward)
		}
		return ans.Out.TensorDict, ans.Version, nil
	}
	out, err := a.m.cfg.Output.Zeros(n)
	if err != nil {
		return nil, 0, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, 0, fmt.Errorf("%w: %w: its stream ended", ErrForward, errGone)
	}
	dst, err := fieldsOf(out, a.m.cfg.Output)
	if err == nil {
		err = copyRows(dst, 0, a.outF, row, n)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: the replica's output rows: %w", ErrForward, err)
	}
	return out, ans.Version, nil
}

// send puts the batch's rows in the replica's rows from row (by
// reference), and sends it the batch, pending its answer. Batches are
// sent one at a time, in the order of their numbers; a send that blocks
// (the stream's flow control) holds no lane's output copy up (a.mu).
func (a *attachedStream) send(ctx context.Context, row, n int, in *tensordict.TensorDict) (pendingBatch, error) {
	msg := replicaBatch{N: n}
	if err := a.putRows(row, n, in, &msg); err != nil {
		return pendingBatch{}, err
	}
	a.smu.Lock()
	defer a.smu.Unlock()
	select {
	case <-a.done:
		return pendingBatch{}, a.gone()
	default:
	}
	a.next++
	msg.Batch = a.next
	p := pendingBatch{batch: msg.Batch, answer: make(chan replicaAnswer, 1)}
	a.pmu.Lock()
	a.pending = append(a.pending, p)
	a.pmu.Unlock()
	var err error
	if a.lane != nil {
		err = a.lane.send(msg.Batch, msg.Row, msg.N)
	} else {
		sctx, cancel := context.WithTimeout(ctx, a.m.cfg.ReplicaTimeout)
		err = a.st.Send(sctx, msg)
		cancel()
	}
	if err != nil {
		return pendingBatch{}, fmt.Errorf("%w: %w: sending it a batch: %v", ErrForward, errGone, err)
	}
	return p, nil
}
