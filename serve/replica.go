package serve

import (
	"context"
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
// The replica opens the stream with a replicaRequest naming the model and,
// when it shares the node's page cache (rpc.Coherent), the folder under
// the root holding its input and output rows: a client's folder
// (ClientsDir/ID: in, out, lock), MaxBatch rows each. The node then sends
// a replicaBatch per batch, one at a time, and the replica answers each
// with a replicaAnswer:
//
//   - by reference (a folder), the node copies the batch's rows into the
//     folder's in rows [0, n) before it sends (batch, n), and the replica
//     writes its outputs into out rows [0, n) before it answers: no row
//     travels on the stream;
//   - by bytes (no folder), the rows travel as TDs after the messages'
//     headers (rpc's bytes mode), in the batch's In and the answer's Out.
//
// An answer with an error (the module raised, its outputs did not fit
// the output schema) fails the batch with ErrForward carrying the
// message, and the node ends the stream with that error; an answer later
// than Config.ReplicaTimeout ends it too, and the batch runs elsewhere, as
// it does when the stream breaks. The process may open another.

// MethodReplica is the message stream a replica in another process attaches
// by.
const MethodReplica = "serve.replica"

type (
	// replicaRequest opens serve.replica.
	replicaRequest struct {
		Name   string `codec:"name"`
		Prefix string `codec:"prefix"` // the replica's folder under the root (by reference); "": rows as bytes
	}
	// replicaBatch is a batch for the replica (node to replica).
	replicaBatch struct {
		Batch uint64  `codec:"batch"` // 1, 2, ... on this stream
		N     int     `codec:"n"`     // rows
		In    *rpc.TD `codec:"in"`    // bytes mode: the rows; by reference: nil, they are in the folder's in rows [0, n)
	}
	// replicaAnswer is the replica's answer to a batch (replica to node).
	replicaAnswer struct {
		Batch   uint64  `codec:"batch"`   // the batch's
		Version uint64  `codec:"version"` // the parameter version that computed it
		Error   string  `codec:"error"`   // "": outputs; else why there are none (the module raised)
		Out     *rpc.TD `codec:"out"`     // bytes mode: the outputs; by reference: nil, they are in the folder's out rows [0, n)
	}
)

// attachedStream is the node's end of one serve.replica stream.
type attachedStream struct {
	m       *Manager
	st      *rpc.ServerStream[replicaAnswer, replicaBatch]
	answers chan replicaAnswer // the reader's, one at a time
	done    chan struct{}      // closed by stop
	once    sync.Once
	err     error // stop's cause

	mu      sync.Mutex // the mappings, while a batch uses them
	closed  bool
	in, out *tensordict.TensorDict // by reference: the replica's rows; nil: bytes
	inF     fields
	outF    fields
	next    uint64
}

// gone is the error of a batch given to the replica after its stream was
// stopped: stop's cause, or, when the stream ended without one (the
// replica went away), errGone.
func (a *attachedStream) gone() error {
	if a.err != nil {
		return a.err
	}
	return fmt.Errorf("%w: %w: its stream ended", ErrForward, errGone)
}

// stop ends the stream with err (the handler returns it).
func (a *attachedStream) stop(err error) {
	a.once.Do(func() {
		a.err = err
		close(a.done)
	})
}

func (svc *Service) replica(ctx context.Context, req replicaRequest, st *rpc.ServerStream[replicaAnswer, replicaBatch]) error {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return err
	}
	a := &attachedStream{m: s.m, st: st, answers: make(chan replicaAnswer, 1), done: make(chan struct{})}
	if req.Prefix != "" {
		if err := svc.mapReplica(ctx, s.m, req.Prefix, a); err != nil {
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
	}()
	go a.read(ctx)
	r, err := s.m.attach(&remote{forward: a.forward})
	if err != nil {
		return err
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		a.stop(nil)
	case <-s.m.ctx.Done(): // the manager closed
		a.stop(ErrStopped)
	}
	s.m.detach(r, a.err)
	if a.err != nil && ctx.Err() == nil {
		return a.err
	}
	return nil
}

// mapReplica maps the replica's rows: its folder's in and out, MaxBatch
// rows of the model's schemas, as a client's slots are mapped.
func (svc *Service) mapReplica(ctx context.Context, m *Manager, prefix string, a *attachedStream) error {
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
	in, err := svc.mapClient(cr, filepath.Join(dir, "in"), m.cfg.Input, m.cfg.MaxBatch, "input")
	if err != nil {
		return err
	}
	out, err := svc.mapClient(cr, filepath.Join(dir, "out"), m.cfg.Output, m.cfg.MaxBatch, "output")
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
	return nil
}

// read receives the replica's answers until the stream ends, and stops it
// then (the replica went away, or closed its side).
func (a *attachedStream) read(ctx context.Context) {
	for {
		ans, err := a.st.Recv(ctx)
		if err != nil {
			a.stop(fmt.Errorf("%w: %w: its stream ended: %v", ErrForward, errGone, err)) // %v: not the stream's code
			return
		}
		if ans.Out != nil && ans.Out.TensorDict != nil && anyMapped(ans.Out.TensorDict) {
			// A reference is valid only until the next Recv, and the
			// batch's outputs outlive it.
			a.stop(fmt.Errorf("%w: the replica sent its outputs by reference; send them as bytes, or write them into its folder's out rows", ErrForward))
			return
		}
		select {
		case a.answers <- ans:
		default:
			a.stop(fmt.Errorf("%w: the replica answered batch %d, which it was not given (serve.replica is one batch at a time)", ErrForward, ans.Batch))
			return
		}
	}
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

// forward runs the batch in on the replica: the manager's remote.
func (a *attachedStream) forward(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error) {
	out, v, err := a.exchange(ctx, in)
	if err != nil {
		a.stop(err)
	}
	return out, v, err
}

func (a *attachedStream) exchange(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, 0, fmt.Errorf("%w: %w: its stream ended", ErrForward, errGone)
	}
	select {
	case <-a.done:
		return nil, 0, a.gone()
	default:
	}
	n := in.BatchSize()[0]
	a.next++
	msg := replicaBatch{Batch: a.next, N: n}
	if a.in != nil {
		src, err := fieldsOf(in, a.m.cfg.Input)
		if err == nil {
			err = copyRows(a.inF, 0, src, 0, n)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w: its input rows: %v", ErrForward, errGone, err)
		}
	} else {
		msg.In = &rpc.TD{TensorDict: in}
	}
	deadline := time.NewTimer(a.m.cfg.ReplicaTimeout)
	defer deadline.Stop()
	sctx, cancel := context.WithTimeout(ctx, a.m.cfg.ReplicaTimeout)
	err := a.st.Send(sctx, msg)
	cancel()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w: sending it a batch: %v", ErrForward, errGone, err)
	}
	var ans replicaAnswer
	select {
	case ans = <-a.answers:
	case <-a.done:
		return nil, 0, a.gone()
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("%w: %v", ErrStopped, ctx.Err())
	case <-deadline.C:
		return nil, 0, fmt.Errorf("%w: %w: no answer within %v (Config.ReplicaTimeout): detached", ErrForward, errGone, a.m.cfg.ReplicaTimeout)
	}
	switch {
	case ans.Batch != msg.Batch:
		return nil, 0, fmt.Errorf("%w: the replica answered batch %d to batch %d", ErrForward, ans.Batch, msg.Batch)
	case ans.Error != "":
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
	dst, err := fieldsOf(out, a.m.cfg.Output)
	if err == nil {
		err = copyRows(dst, 0, a.outF, 0, n)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: the replica's output rows: %w", ErrForward, err)
	}
	return out, ans.Version, nil
}
