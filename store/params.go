package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// A parameter set is a named sequence of versions (1, 2, ...), each an
// immutable value kept as a prefix under values/. Readers hold a lease on
// the version they read; a version is deleted once a newer one is durable
// and no lease holds it.
type paramSet struct {
	latest   uint64
	versions map[uint64]*version
}

type version struct {
	id           uint64 // the value
	size         int64
	rev          uint64 // the revision that published it
	supersededAt uint64 // the revision that published the next one
	leases       int
	keepUntil    time.Time // after Open: kept this long for old leases to renew
	lost         bool      // its folder is missing (ErrMissing)
}

// lease holds a version for a reader until it expires (zero: until
// released).
type lease struct {
	name    string
	v       uint64
	expires time.Time
}

// verInfo is a version handed to a reader.
type verInfo struct {
	name    string
	v       uint64
	id      uint64
	size    int64
	lease   uint64 // 0: none taken
	expires time.Time
}

// publishValue makes an ingested value (a prefix) the next version of the
// parameter set name and returns its number once durable.
func (s *Store) publishValue(name string, in *ingest, req reqID) (uint64, uint64, error) {
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		s.discard(in)
		return 0, 0, err
	}
	if e, done, err := s.seenLocked(req); err != nil || done {
		s.mu.Unlock()
		s.discard(in)
		if err != nil {
			return 0, 0, err
		}
		return e.Version, e.Rev, s.waitRead(e.Rev)
	}
	var v uint64 = 1
	if ps := s.params[name]; ps != nil {
		v = ps.latest + 1
	}
	rec := &record{Op: recPublish, Name: name, Version: v, Items: []recItem{in.item}, Req: req}
	p, err := prepare(rec)
	if err != nil {
		s.mu.Unlock()
		s.discard(in)
		return 0, 0, err
	}
	s.rev++
	rec.Rev = s.rev
	s.commitLocked(rec, p)
	s.mu.Unlock()
	if err := s.log.wait(rec.Rev); err != nil {
		return 0, 0, err
	}
	s.collect() // the version it replaced, if nobody reads it
	return v, rec.Rev, nil
}

// Publish stores td as the next version of the parameter set name (1 for
// the first) and returns its number once durable. The value is written
// into a prefix of its own (copied: td stays the caller's), which readers
// that share the filesystem map instead of receiving its bytes.
func (s *Store) Publish(ctx context.Context, name string, td *tensordict.TensorDict) (uint64, error) {
	if err := CheckName(name); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	in, err := s.ingestTD(td, true)
	if err != nil {
		return 0, err
	}
	v, _, err := s.publishValue(name, in, reqID{})
	return v, err
}

// readVersion returns the latest version of name if it is newer than
// after, leased for ttl (0: until released; <0: no lease) once durable.
// With wait it blocks until there is one, or ctx ends; without, it fails
// with ErrNotFound.
func (s *Store) readVersion(ctx context.Context, name string, after uint64, wait bool, ttl time.Duration) (verInfo, error) {
	if err := CheckName(name); err != nil {
		return verInfo{}, err
	}
	for {
		s.mu.Lock()
		if err := s.enterLocked(); err != nil {
			s.mu.Unlock()
			return verInfo{}, err
		}
		ps := s.params[name]
		if ps != nil && ps.latest > after {
			ver := ps.versions[ps.latest]
			if ver.lost {
				s.mu.Unlock()
				return verInfo{}, missingVersion(name, ps.latest, ver.id)
			}
			info := verInfo{name: name, v: ps.latest, id: ver.id, size: ver.size}
			if ttl >= 0 {
				info.lease = newLeaseID(s.leases)
				if ttl > 0 {
					info.expires = time.Now().Add(ttl)
				}
				s.leases[info.lease] = &lease{name: name, v: info.v, expires: info.expires}
				ver.leases++
			}
			rev := ver.rev
			s.mu.Unlock()
			if err := s.waitRead(rev); err != nil {
				s.release(info.lease)
				return verInfo{}, err
			}
			if s.valueGone(info.id) {
				s.mu.Lock()
				if !ver.lost {
					ver.lost = true
					s.opts.Logger.Error(lostVersionMsg, "parameters", name, "version", info.v, "path", s.valuePath(info.id))
				}
				s.mu.Unlock()
				s.release(info.lease)
				return verInfo{}, missingVersion(name, info.v, info.id)
			}
			return info, nil
		}
		if !wait {
			s.mu.Unlock()
			if ps == nil {
				return verInfo{}, errorf(ErrNotFound, "no parameters published as %q", name)
			}
			return verInfo{}, errorf(ErrNotFound, "no version of %q newer than %d", name, after)
		}
		ch := s.published()
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return verInfo{}, ctx.Err()
		case <-s.done:
			return verInfo{}, ErrClosed
		}
	}
}

// missingVersion is ErrMissing for a parameter version whose folder is
// missing.
func missingVersion(name string, v, id uint64) error {
	return errorf(ErrMissing, "parameters %q version %d: its folder %s is missing: it is lost; publish a newer version",
		name, v, relValue(id))
}

// published returns a channel closed at the next publication; s.mu is
// held.
func (s *Store) published() <-chan struct{} {
	if s.pub == nil {
		s.pub = make(chan struct{})
	}
	return s.pub
}

func newLeaseID(inUse map[uint64]*lease) uint64 {
	for {
		var b [8]byte
		rand.Read(b[:])
		id := binary.LittleEndian.Uint64(b[:])
		if id != 0 && inUse[id] == nil {
			return id
		}
	}
}

// renew extends leases by ttl. A lease the store does not know (it
// expired, or the node restarted) is taken again if its version is still
// there; otherwise renew reports it lost, and its reader should move to a
// newer version.
func (s *Store) renew(ls []leaseRef, ttl time.Duration) (lost []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	until := time.Now().Add(ttl)
	for _, r := range ls {
		if l := s.leases[r.ID]; l != nil {
			l.expires = until
			continue
		}
		ver := s.versionLocked(r.Name, r.Version)
		if ver == nil {
			lost = append(lost, r.ID)
			continue
		}
		s.leases[r.ID] = &lease{name: r.Name, v: r.Version, expires: until}
		ver.leases++
	}
	return lost
}

func (s *Store) versionLocked(name string, v uint64) *version {
	if ps := s.params[name]; ps != nil {
		return ps.versions[v]
	}
	return nil
}

// release ends a lease and deletes its version if that frees it.
func (s *Store) release(id uint64) {
	if id == 0 {
		return
	}
	s.mu.Lock()
	s.releaseLocked(id)
	s.mu.Unlock()
	s.collect()
}

func (s *Store) releaseLocked(id uint64) {
	l := s.leases[id]
	if l == nil {
		return
	}
	delete(s.leases, id)
	if ver := s.versionLocked(l.name, l.v); ver != nil {
		ver.leases--
	}
}

// collect deletes the versions nobody needs.
func (s *Store) collect() {
	s.mu.Lock()
	gone := s.collectLocked(time.Now())
	s.mu.Unlock()
	for _, id := range gone {
		s.trashValue(id)
	}
}

// collectLocked forgets the versions that are not the latest, whose
// successor is durable, that no lease holds and that are past their grace
// after Open, and returns their values.
func (s *Store) collectLocked(now time.Time) []uint64 {
	var gone []uint64
	// s.durable is advanced before a Publish waiting for its record is
	// woken (logWriter.madeDurable), so the version that Publish
	// superseded goes at once.
	durable := s.durable
	for _, ps := range s.params {
		for v, ver := range ps.versions {
			if v != ps.latest && ver.leases <= 0 && durable >= ver.supersededAt && !now.Before(ver.keepUntil) {
				delete(ps.versions, v)
				gone = append(gone, ver.id)
			}
		}
	}
	return gone
}

// Param is one version of a parameter set, held for its reader: a lease
// keeps the node from deleting it until Close.
type Param struct {
	Name    string
	Version uint64

	// TD is the parameters: a read-only mapping of the version's prefix
	// (in process, or a client sharing the node's filesystem), or a copy
	// in Go memory (bytes). Valid until Close.
	TD *tensordict.TensorDict

	once    sync.Once
	release func() error
	mu      sync.Mutex
	lost    error
}

// Close releases the lease and unmaps the parameters; TD must not be used
// afterwards. Safe to call more than once.
func (p *Param) Close() error {
	var err error
	p.once.Do(func() {
		if p.release != nil {
			err = p.release()
		}
	})
	return err
}

// Err returns nil while the lease holds, and an error matching ErrExpired
// once the client found it lost (it could not renew it in time and the
// version was deleted). A mapping stays readable even then: deleting a
// mapped file does not take the mapping away on Linux or macOS.
func (p *Param) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

func (p *Param) setLost(err error) {
	p.mu.Lock()
	p.lost = err
	p.mu.Unlock()
}

// localParam maps a version leased in process.
func (s *Store) localParam(info verInfo) (*Param, error) {
	td, err := tensordict.LoadMemmap(s.valuePath(info.id), tensordict.InRoot(s.root), tensordict.ReadOnly())
	if err != nil {
		s.release(info.lease)
		return nil, s.closedErr(fmt.Errorf("store: parameters %q version %d: %w", info.name, info.v, err))
	}
	return &Param{Name: info.name, Version: info.v, TD: td, release: func() error {
		err := td.Close()
		s.release(info.lease)
		return err
	}}, nil
}

// Latest returns the latest version of the parameter set name, leased
// until the Param is closed. ErrNotFound if none was published.
func (s *Store) Latest(ctx context.Context, name string) (*Param, error) {
	info, err := s.readVersion(ctx, name, 0, false, 0)
	if err != nil {
		return nil, err
	}
	return s.localParam(info)
}

// WaitNewer returns the latest version of the parameter set name once it
// is newer than v, waiting for it to be published if need be, until ctx
// ends. WaitNewer(ctx, name, 0) waits for the first version.
func (s *Store) WaitNewer(ctx context.Context, name string, v uint64) (*Param, error) {
	info, err := s.readVersion(ctx, name, v, true, 0)
	if err != nil {
		return nil, err
	}
	return s.localParam(info)
}

// leaseRef names a lease and what it holds, so the node can take it again
// after a restart.
type leaseRef struct {
	ID      uint64 `codec:"id"`
	Name    string `codec:"name"`
	Version uint64 `codec:"version"`
}
