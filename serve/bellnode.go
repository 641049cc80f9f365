package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The node's side of the bell (bell.go): a bell file per served model and
// a poller goroutine that takes the requests from the clients' rings.

// nodeBell is a served model's bell and its poller.
type nodeBell struct {
	dir  string // BellsDir/ID under the root
	rel  string // dir relative to the root, as clients are told it
	lock *lockfile.Lock
	b    *shm.Map
	stop chan struct{} // closed by close: the poller returns
	done chan struct{} // closed when it has
}

// pollNap bounds the poller's sleep: it looks at dropped registrations at
// least this often.
const pollNap = 10 * time.Millisecond

// failure is the error of a request that failed, kept for serve.failure.
type failure struct {
	seq uint32
	err error
}

// ensureBellLocked makes the model's bell and starts its poller, once.
// s.mu is held.
func (s *served) ensureBellLocked() (*nodeBell, error) {
	if s.bell != nil {
		return s.bell, nil
	}
	parent := filepath.Join(s.root, filepath.FromSlash(BellsDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	if err := checkFolders(s.root, BellsDir); err != nil { // no link on the way out of the root (links.go)
		return nil, err
	}
	var id [8]byte
	rand.Read(id[:])
	name := hex.EncodeToString(id[:])
	tmp := filepath.Join(parent, ".tmp-"+name)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return nil, err
	}
	lock, err := lockfile.Acquire(filepath.Join(tmp, "lock"))
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	b, err := createShared(filepath.Join(tmp, "bell"), bellSize)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(parent, name))
		if err != nil {
			unmapShared(b)
		}
	}
	if err != nil {
		lock.Release()
		os.RemoveAll(tmp)
		return nil, err
	}
	nb := &nodeBell{dir: filepath.Join(parent, name), rel: BellsDir + "/" + name, lock: lock, b: b,
		stop: make(chan struct{}), done: make(chan struct{})}
	s.bell = nb
	go s.poll(nb)
	return nb, nil
}

// close stops the poller, and removes the bell's folder.
func (nb *nodeBell) close() {
	close(nb.stop)
	<-nb.done
	unmapShared(nb.b)
	os.RemoveAll(nb.dir)
	nb.lock.Release()
}

// poll takes requests from the rings of the registered clients until the
// bell is closed, sleeping on the bell when there are none. It is the
// only reader of the rings' tails and writer of their heads, and it
// unmaps the rings of dropped registrations once no request uses them;
// when it stops, the last request of each leaves its ring to release.
func (s *served) poll(nb *nodeBell) {
	defer close(nb.done)
	ring, sleeping := nb.b.Uint32(bellRing), nb.b.Uint32(bellSleep)
	for {
		select {
		case <-nb.stop:
			s.reapRings(true)
			return
		default:
		}
		if s.scanRings() {
			continue
		}
		sleeping.Store(1)
		v := ring.Load()
		if s.scanRings() {
			sleeping.Store(0)
			continue
		}
		ring.Wait(v, pollNap)
		sleeping.Store(0)
		s.reapRings(false)
	}
}

// scanRings takes the new entries of every ring and starts their
// requests; it reports whether there were any.
func (s *served) scanRings() bool {
	list := s.rings.Load()
	if list == nil {
		return false
	}
	any := false
	for _, r := range *list {
		n, err := s.scanRing(r)
		if n > 0 {
			any = true
		}
		if err != nil {
			s.m.log.Error("serve: a client's ring is unreadable; dropping its registration", "model", s.name,
				"client", r.prefix, "err", err)
			s.mu.Lock()
			if s.clients[r.id] == r {
				delete(s.clients, r.id)
				s.dropLocked(r)
			}
			s.mu.Unlock()
		}
	}
	return any
}

// scanRing takes r's new entries, under a fault guard: a ring file
// truncated under the node is an error, not a crash. So are a ring that
// says it holds more entries than slots, and an entry whose first row is
// not a slot (it has no record to be answered in); the caller drops the
// client's registration.
func (s *served) scanRing(r *registration) (n int, err error) {
	v := r.ring
	err = v.b.Guard(func() error {
		head, tail := v.head().Load(), v.tail().Load()
		if tail-head > uint64(v.slots) {
			return fmt.Errorf("%d entries in a ring of %d", tail-head, v.slots)
		}
		for ; head != tail; head++ {
			start, rows, seq := splitEntry(v.entry(head).Load())
			if start >= v.slots {
				// No record to answer it in: the client is broken.
				return fmt.Errorf("an entry for row %d of a client's %d slots", start, v.slots)
			}
			v.head().Store(head + 1)
			if !s.acquireEntry(r, start, seq) {
				return nil // dropped meanwhile
			}
			n++
			s.serveEntry(r, start, rows, seq)
		}
		return nil
	})
	if errors.Is(err, memmap.ErrFault) {
		n, err = 0, fmt.Errorf("reading the ring: %w", err)
	}
	return n, err
}

// acquireEntry takes a reference on r's mappings for request seq at
// start, the newest at start from now on, unless r was dropped.
func (s *served) acquireEntry(r *registration, start int, seq uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.gone {
		return false
	}
	if r.latest == nil {
		r.latest = make([]uint32, r.ring.slots)
	}
	r.latest[start] = seq
	r.refs++
	r.expires = time.Now().Add(s.lease)
	return true
}

// serveEntry submits a request from a ring to the manager; the replica
// that runs it answers it in its record (or this goroutine, when it is
// refused at once). It holds a reference on r until then.
//
// A request of a registration dropped meanwhile (r.gone) is not answered:
// neither its outputs nor its record are written. Its client registers
// again and sends it again, and may have written new inputs into those
// rows and had them answered by then: a late answer would overwrite the
// newer outputs and record. The check and the writes are under s.mu, which
// dropLocked holds, so that none starts after the drop.
//
// Nor is a request once the node took a newer one for the same first row
// (acquireEntry): the client gave it up (its context ended) and sent
// another on those rows, and its late answer would overwrite the newer
// one's outputs and record, as a dropped registration's would.
func (s *served) serveEntry(r *registration, start, n int, seq uint32) {
	m := s.m
	current := func() bool { return !r.gone && r.latest[start] == seq } // under s.mu
	done := func(v uint64, err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if current() {
			if err != nil {
				if r.failures == nil {
					r.failures = map[int]failure{}
				}
				r.failures[start] = failure{seq: seq, err: err}
			}
			answer(r.ring, start, seq, v, err != nil)
		}
		s.releaseLocked(r)
	}
	if n < 1 || n > m.cfg.MaxBatch || start < 0 || start > r.slots-n {
		done(0, schemaErrorf("rows [%d, %d) of a client's %d slots, at most %d at once", start, start+n, r.slots, m.cfg.MaxBatch))
		return
	}
	err := m.submit(n,
		func(buf fields, row int) error { return copyRows(buf, row, r.inF, start, n) },
		func(_ *tensordict.TensorDict, res fields, row int) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !current() {
				return nil // not answered (above)
			}
			return copyRows(r.outF, start, res, row, n)
		},
		done)
	if err != nil {
		done(0, err)
	}
}

// answer writes a request's record: status and version, then the sequence
// number done, and wakes the client if it sleeps on it. A fault (the ring
// truncated) is ignored: the client is gone or broken.
func answer(v *ringView, start int, seq uint32, version uint64, failed bool) {
	status := uint32(0)
	if failed {
		status = 1
	}
	v.b.Guard(func() error {
		v.status(start).Store(status)
		v.version(start).Store(version)
		v.done(start).Store(seq)
		if v.waiters(start).Load() > 0 {
			v.done(start).Wake()
		}
		return nil
	})
}

// reapRings unmaps the rings of dropped registrations that no request
// uses. A ring whose registration still has requests in a batch stays
// mapped until they end: their references hold all its mappings, the
// ring's as the slots'. When the poller stops (stopped), it leaves those
// to release, which unmaps each ring once its last request ends.
func (s *served) reapRings(stopped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := s.deadRings[:0]
	for _, r := range s.deadRings {
		if r.refs == 0 {
			unmapShared(r.ring.b)
		} else if !stopped {
			keep = append(keep, r)
		}
	}
	s.deadRings = keep
	s.pollerDone = stopped
}

// updateRingsLocked publishes the list of registrations with rings that
// the poller reads. s.mu is held.
func (s *served) updateRingsLocked() {
	var list []*registration
	for _, r := range s.clients {
		if r.ring != nil {
			list = append(list, r)
		}
	}
	s.rings.Store(&list)
}

// mapRing maps a client's ring file through cr, its folder, checks its size and
// takes over its entries: those appended before are dropped (they were
// for a node that is gone), head = tail.
func (svc *Service) mapRing(cr *os.Root, slots int) (*ringView, error) {
	f, err := cr.OpenFile("ring", os.O_RDWR, 0) // cr: the client's folder (openPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, _ := ringSize(slots)
	b, err := openShared(f, size)
	if err != nil {
		return nil, err
	}
	v, err := newRingView(b, slots)
	if err == nil {
		err = b.Guard(func() error {
			v.head().Store(v.tail().Load())
			return nil
		})
	}
	if err != nil {
		unmapShared(b)
		return nil, err
	}
	return v, nil
}

// failureRequest asks for the error of a request that failed.
type failureRequest struct {
	Name   string `codec:"name"`
	Client uint64 `codec:"client"`
	Start  int    `codec:"start"`
	Seq    uint32 `codec:"seq"`
}

// MethodFailure returns, as its error, the error of a request by bell
// whose record says it failed.
const MethodFailure = "serve.failure"

func (svc *Service) failure(_ context.Context, req failureRequest) (rpc.Empty, error) {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return rpc.Empty{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.clients[req.Client]
	if r == nil {
		return rpc.Empty{}, fmt.Errorf("%w: client %x on model %q", ErrNotRegistered, req.Client, s.name)
	}
	f, ok := r.failures[req.Start]
	if !ok || f.seq != req.Seq {
		return rpc.Empty{}, rpc.Errorf(rpc.NotFound, "serve: no failure of request %d at row %d", req.Seq, req.Start)
	}
	delete(r.failures, req.Start)
	return rpc.Empty{}, f.err
}
