package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Attached replicas: a replica of the manager whose model runs in another
// process (a Python process holding a torch.nn.Module), attached over the
// serve.replica message stream (replica.go). To the manager it is one more
// replica: a goroutine that takes batches as the others do, and hands each
// to its process instead of calling a Model. What differs is how it ends:
//
//   - it is never replaced: a batch it fails (an exception, outputs of the
//     wrong schema, a deadline) fails with ErrForward and the replica is
//     detached; its process may attach again;
//   - when its process goes away before answering (the stream broke, it
//     was killed), the batch it held is run again by another replica, up
//     to maxTries replicas; with none left it waits Config.AttachWait for
//     one to attach, as requests do, then fails with ErrForward;
//   - when no replica is left at all, requests wait at most
//     Config.AttachWait for one to attach, then fail with ErrNoReplica.

// maxTries bounds the replicas a batch is handed to when each goes away
// before answering.
const maxTries = 3

// errGone marks an attached replica's error that says its process went
// away (or stopped answering) before it answered: the batch may run again
// elsewhere, since nothing of its outputs was handed out.
var errGone = errors.New("serve: the attached replica went away")

// remote is the manager's view of one lane of an attached replica:
// forward sends it a batch and returns its outputs and the parameter
// version that made them. A replica that takes W batches in flight
// (replicaRequest.Window) is W lanes, each a replica of the manager with
// a goroutine of its own, all of one group: they attach and detach
// together, so that a batch of a lane whose process went away is never
// handed to another lane of the same process.
type remote struct {
	forward func(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error)
	group   *remoteGroup
}

// remoteGroup is one attached replica: its lanes, in the order attach
// made them (the first one's index names it in the logs). Fixed once
// attach returns; guarded by Manager.mu as the lanes are.
type remoteGroup struct {
	lanes []*replica
}

// forwardFunc is a lane's forward.
type forwardFunc = func(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error)

// startAttachedOnly finishes New for a manager without replicas of its
// own: one buffer, for the open batch; attach adds one per replica.
func (m *Manager) startAttachedOnly() (*Manager, error) {
	if err := m.addBufferLocked(); err != nil {
		return nil, err
	}
	m.st.hist = make([]uint64, m.cfg.MaxBatch+1)
	return m, nil
}

// addBufferLocked adds a batch buffer to the free ones.
func (m *Manager) addBufferLocked() error {
	td, err := m.cfg.Input.Zeros(m.cfg.MaxBatch)
	if err != nil {
		return configErrorf("input buffer: %v", err)
	}
	f, err := fieldsOf(td, m.cfg.Input)
	if err != nil {
		return err
	}
	m.free = append(m.free, &buffer{td: td, f: f})
	return nil
}

// putBufferLocked returns a batch's buffer to the free ones, or drops it
// when a replica detached since (each replica brings one).
func (m *Manager) putBufferLocked(b *buffer) {
	if m.surplus > 0 {
		m.surplus--
		return
	}
	m.free = append(m.free, b)
}

// attach adds an attached replica whose lanes run batches with lanes
// (one forward per batch it takes in flight; at least one), and returns
// its first lane. It serves until detach, or the manager closes.
func (m *Manager) attach(lanes []forwardFunc) (*replica, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrStopped
	}
	if len(lanes) == 0 {
		return nil, fmt.Errorf("serve: an attached replica of no lanes")
	}
	for range lanes { // a buffer per batch it may hold
		if err := m.addBufferLocked(); err != nil {
			return nil, err
		}
	}
	if m.open == nil {
		m.openBatchLocked() // requests may wait behind a missing buffer
	}
	g := &remoteGroup{lanes: make([]*replica, 0, len(lanes))}
	for _, fwd := range lanes {
		r := &replica{index: m.nextIdx, remote: &remote{forward: fwd, group: g}}
		m.nextIdx++
		r.timer = time.AfterFunc(time.Hour, m.wake)
		r.timer.Stop()
		m.replicas = append(m.replicas, r)
		g.lanes = append(g.lanes, r)
		m.wg.Add(1)
		go m.serve(r)
	}
	if m.orphan != nil {
		m.orphan.Stop()
		m.orphan = nil
	}
	m.st.attached++
	m.cond.Broadcast()
	return g.lanes[0], nil
}

// detach removes the attached replica of lane r, all its lanes, for cause
// (nil: its process left in good order). A batch a lane runs is its own
// to finish: runBatch fails it or hands it to another replica
// (retryElsewhere).
func (m *Manager) detach(r *replica, cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.detachLocked(r, cause)
}

func (m *Manager) detachLocked(r *replica, cause error) {
	if r.gone {
		return
	}
	g := r.remote.group
	for _, x := range g.lanes {
		x.gone = true
		x.timer.Stop()
	}
	m.replicas = slices.DeleteFunc(m.replicas, func(x *replica) bool { return x.remote != nil && x.remote.group == g })
	lanes := len(g.lanes)
	m.surplus += lanes // each lane brought a buffer
	for len(m.free) > 0 && m.surplus > 0 {
		m.free, m.surplus = m.free[:len(m.free)-1], m.surplus-1
	}
	m.st.detached++
	if cause != nil {
		m.log.Warn("serve: an attached replica was detached", "replica", g.lanes[0].index, "lanes", lanes, "err", cause)
	} else {
		m.log.Info("serve: an attached replica left", "replica", g.lanes[0].index, "lanes", lanes)
	}
	m.armOrphanLocked()
	m.cond.Broadcast()
}

// retryElsewhere detaches r (all its lanes), whose forward of b failed
// with err, and, when err says its process went away before answering
// (errGone) and b has not been to maxTries replicas yet, queues b for
// another and reports true: b's requests wait on. With no replica left, b
// waits Config.AttachWait for one to attach, as a request does (a replica
// restarting, or one attaching as the last leaves), then fails with
// ErrForward (failOrphans). Otherwise b fails as any failed batch does.
// Each lane of a replica that went away comes here with its own batch:
// every batch it held goes elsewhere, none to one of its lanes.
func (m *Manager) retryElsewhere(r *replica, b *batch, err error) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !errors.Is(err, errGone) || m.closed {
		return false
	}
	m.detachLocked(r, err)
	if b.tries+1 >= maxTries {
		return false
	}
	b.tries++
	r.busy = false
	// With no replica left, detachLocked has armed the timer that fails b
	// after AttachWait (a manager with no replicas of its own is
	// AttachedOnly, whose timer arms whatever waits).
	m.retry = append(m.retry, b)
	m.cond.Broadcast()
	return true
}

// armOrphanLocked starts the timer that fails the requests waiting while
// no replica is there (Config.AttachWait), unless it runs, there is a
// replica, or nothing waits.
func (m *Manager) armOrphanLocked() {
	if m.orphan != nil || m.closed || len(m.replicas) > 0 || m.cfg.AttachWait <= 0 {
		return
	}
	if m.queued == 0 && len(m.retry) == 0 && !m.cfg.AttachedOnly {
		return
	}
	m.orphan = time.AfterFunc(m.cfg.AttachWait, m.failOrphans)
}

// failOrphans fails every request waiting for a replica with
// ErrNoReplica, if none attached since the timer started.
func (m *Manager) failOrphans() {
	m.mu.Lock()
	m.orphan = nil
	if m.closed || len(m.replicas) > 0 {
		m.mu.Unlock()
		return
	}
	err := fmt.Errorf("%w: none attached within %v (Config.AttachWait)", ErrNoReplica, m.cfg.AttachWait)
	var failed []*batch
	if b := m.open; b != nil && b.reqs > 0 {
		m.open = nil
		m.queued -= b.rows
		b.taken = true
		for b.copying > 0 {
			m.cond.Wait()
		}
		b.err = err
		m.putBufferLocked(b.in)
		failed = append(failed, b)
	}
	for _, b := range m.retry {
		b.err = fmt.Errorf("%w: its replica went away, and none attached within %v (Config.AttachWait)", ErrForward, m.cfg.AttachWait)
		m.putBufferLocked(b.in)
		failed = append(failed, b)
	}
	m.retry = nil
	var async []*request
	for _, r := range m.overflow {
		m.queued -= r.n
		if r.done != nil {
			async = append(async, r)
		} else {
			r.fail = err
			close(r.placed)
		}
	}
	m.overflow = nil
	m.st.orphaned += uint64(len(failed) + len(async))
	m.cond.Broadcast()
	m.mu.Unlock()
	for _, b := range failed {
		close(b.done)
		answerAsync(b)
	}
	for _, r := range async {
		r.done(0, err)
	}
}

// attachedNowLocked counts the attached replicas (not their lanes).
func (m *Manager) attachedNowLocked() int {
	n := 0
	for _, r := range m.replicas {
		if r.remote != nil && r.remote.group.lanes[0] == r {
			n++
		}
	}
	return n
}
