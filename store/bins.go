package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// A bin is a list of items, oldest first. A bin without items does not
// exist: Get that empties it, or Delete, removes it.
type bin struct {
	items []*item
}

// item is one value in a bin: inline bytes, or the prefix values/<id>.
type item struct {
	id     uint64
	size   int64  // the value's tensor bytes
	inline []byte // nil: a prefix
	take   uint64 // the remote Get holding it for its acknowledgement; 0: none
	lost   bool   // its prefix's folder is missing (ErrMissing)
}

func (it *item) rec() recItem { return recItem{ID: it.id, Size: it.size, Inline: it.inline} }

// take is a remote Get between its two phases: the items it returned,
// held until the caller acknowledges them (then they are removed) or until
// expires (then other Gets may take them).
type take struct {
	bin     string
	ids     []uint64
	expires time.Time
}

// dropTakeLocked ends a take without removing its items.
func (s *Store) dropTakeLocked(id uint64) {
	tk := s.takes[id]
	if tk == nil {
		return
	}
	delete(s.takes, id)
	if b := s.bins[tk.bin]; b != nil {
		for _, it := range b.items {
			if it.take == id {
				it.take = 0
			}
		}
	}
}

// recentTakes are the ids of the Gets acknowledged last, so that an
// acknowledgement retried after its reply was lost is recognised.
type recentTakes struct {
	set   map[uint64]bool
	order []uint64
}

const keptTakes = 4096

func (r *recentTakes) add(id uint64) {
	if r.set == nil {
		r.set = map[uint64]bool{}
	}
	if r.set[id] {
		return
	}
	r.set[id] = true
	r.order = append(r.order, id)
	if len(r.order) > 2*keptTakes {
		for _, old := range r.order[:len(r.order)-keptTakes] {
			delete(r.set, old)
		}
		r.order = append([]uint64(nil), r.order[len(r.order)-keptTakes:]...)
	}
}

func (r *recentTakes) has(id uint64) bool { return r.set[id] }
func (r *recentTakes) list() []uint64     { return append([]uint64(nil), r.order...) }

// requests remembers each client's recent mutating requests and what they
// returned, so that a request retried after its reply was lost (the node
// restarted, the connection broke) is answered again instead of applied
// twice. A client has at most keptRequests requests in flight that matter:
// a retry older than its client's last keptRequests is refused
// (ErrExpired), since whether it was applied can no longer be told.
type requests struct {
	clients map[uint64]*clientReqs
}

type clientReqs struct {
	maxSeq uint64
	done   map[uint64]reqEntry
	last   uint64 // the revision of its last request, for eviction
}

const (
	keptRequests = 1024 // per client
	keptClients  = 4096
)

func (r *requests) add(e reqEntry) {
	c := r.clients[e.ID.Client]
	if c == nil {
		if len(r.clients) >= keptClients {
			r.evict()
		}
		c = &clientReqs{done: map[uint64]reqEntry{}}
		r.clients[e.ID.Client] = c
	}
	c.done[e.ID.Seq] = e
	c.maxSeq = max(c.maxSeq, e.ID.Seq)
	c.last = max(c.last, e.Rev)
	if len(c.done) > 2*keptRequests {
		for seq := range c.done {
			if seq+keptRequests <= c.maxSeq {
				delete(c.done, seq)
			}
		}
	}
}

// evict forgets the client idle longest.
func (r *requests) evict() {
	var oldest uint64
	var at uint64 = ^uint64(0)
	for id, c := range r.clients {
		if c.last < at {
			oldest, at = id, c.last
		}
	}
	delete(r.clients, oldest)
}

// lookup returns the entry of a request made already. stale reports a
// request too old to tell.
func (r *requests) lookup(id reqID) (e reqEntry, found, stale bool) {
	if id == (reqID{}) {
		return reqEntry{}, false, false
	}
	c := r.clients[id.Client]
	if c == nil {
		return reqEntry{}, false, false
	}
	if e, ok := c.done[id.Seq]; ok {
		return e, true, false
	}
	return reqEntry{}, false, id.Seq+keptRequests <= c.maxSeq
}

func (r *requests) list() []reqEntry {
	var out []reqEntry
	for _, c := range r.clients {
		for _, e := range c.done {
			if e.ID.Seq+keptRequests > c.maxSeq {
				out = append(out, e)
			}
		}
	}
	return out
}

// seen answers a request made already: done with its entry, or an error
// for one too old to tell. s.mu is held.
func (s *Store) seenLocked(id reqID) (reqEntry, bool, error) {
	e, found, stale := s.reqs.lookup(id)
	if stale {
		return e, false, errorf(ErrExpired, "request %d of client %x is too old to tell whether it was applied", id.Seq, id.Client)
	}
	return e, found, nil
}

// putValue replaces (put) or extends (append) bin with a value ingested
// already, and returns the revision once it is durable.
func (s *Store) putValue(bin string, in *ingest, op uint8, req reqID) (uint64, error) {
	return s.putValues(bin, []*ingest{in}, op, req)
}

// putValues is putValue with the values ins, in order, as one record: one
// revision, one event, all or none of them. It discards ins on failure.
func (s *Store) putValues(bin string, ins []*ingest, op uint8, req reqID) (uint64, error) {
	rec := &record{Op: op, Name: bin, Items: make([]recItem, len(ins)), Req: req}
	for i, in := range ins {
		rec.Items[i] = in.item
	}
	p, err := prepare(rec)
	if err != nil {
		s.discardAll(ins)
		return 0, err
	}
	from := 0
	for i, in := range ins {
		if b := in.item.Inline; b != nil {
			// Keep the value in the frame, which holds its bytes anyway, and
			// let the next value reuse the buffer it was encoded into.
			var a []byte
			if a, from = aliasInline(p.frame, b, from); a != nil {
				rec.Items[i].Inline, in.item.Inline = a, a
				recycleValueBuf(b)
			}
		}
	}
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		s.discardAll(ins)
		return 0, err
	}
	if e, done, err := s.seenLocked(req); err != nil || done {
		s.mu.Unlock()
		s.discardAll(ins)
		if err != nil {
			return 0, err
		}
		return e.Rev, s.waitRead(e.Rev)
	}
	if op == recPut {
		if b := s.bins[bin]; b != nil {
			// The Gets holding the old items lose them: their
			// acknowledgements fail with ErrExpired.
			for _, it := range b.items {
				if it.take != 0 {
					s.dropTakeLocked(it.take)
				}
			}
		}
	}
	s.rev++
	rec.Rev = s.rev
	dropped := s.commitLocked(rec, p)
	s.mu.Unlock()
	return rec.Rev, s.settle(rec.Rev, dropped)
}

// Put replaces the bin's content with td, as its one item, and returns the
// store's revision after it. The value is copied: td stays the caller's.
// It returns once the operation is durable (Options.NoSync: written).
func (s *Store) Put(ctx context.Context, bin string, td *tensordict.TensorDict) (uint64, error) {
	return s.store(ctx, bin, td, recPut)
}

// Append adds td to the bin as its last item (an empty bin takes it as its
// one item) and returns the store's revision after it, as Put does.
func (s *Store) Append(ctx context.Context, bin string, td *tensordict.TensorDict) (uint64, error) {
	return s.store(ctx, bin, td, recAppend)
}

// Extend adds tds to the bin, in order, as its last items, in one
// operation: one revision (returned once durable), one event, and all of
// them or, on error, none. ErrFormat for no values or more than 4096;
// ErrTooLarge for values that make a log record over 1 GiB together (those
// of InlineBytes or more are prefixes, and count little). The values are
// copied.
func (s *Store) Extend(ctx context.Context, bin string, tds []*tensordict.TensorDict) (uint64, error) {
	if err := checkExtend(bin, len(tds)); err != nil {
		return 0, err
	}
	if err := checkExtendValues(tds, s.opts.InlineBytes); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ins, err := s.ingestAll(len(tds), func(i int) (*ingest, error) { return s.ingestTD(tds[i], false) })
	if err != nil {
		return 0, err
	}
	return s.putValues(bin, ins, recAppend, reqID{})
}

func (s *Store) store(ctx context.Context, bin string, td *tensordict.TensorDict, op uint8) (uint64, error) {
	if err := CheckName(bin); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	in, err := s.ingestTD(td, false)
	if err != nil {
		return 0, err
	}
	return s.putValue(bin, in, op, reqID{})
}

// taken is what takeItems returns: the items, the take holding them (0
// for a Peek or an empty Get), and the revision they are at.
type taken struct {
	id    uint64
	items []*item
	rev   uint64
}

// takeItems returns the bin's items. With remove (a Get), it returns only
// the items no other Get holds and holds them for the caller until
// ackTake removes them or timeout passes; without (a Peek), all of them.
func (s *Store) takeItems(bin string, remove bool, timeout time.Duration) (taken, error) {
	return s.takeItemsAs(bin, 0, remove, timeout)
}

// takeItemsAs is takeItems with the take's id chosen by the caller (0: a
// new one).
func (s *Store) takeItemsAs(bin string, id uint64, remove bool, timeout time.Duration) (taken, error) {
	if err := CheckName(bin); err != nil {
		return taken{}, err
	}
	s.markMissing(bin)
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return taken{}, err
	}
	if id != 0 {
		if err := s.spentLocked(id); err != nil {
			s.mu.Unlock()
			return taken{}, err
		}
	}
	t := taken{rev: s.rev}
	if b := s.bins[bin]; b != nil {
		var lost []*item
		for _, it := range b.items {
			switch {
			case it.lost:
				lost = append(lost, it)
			case !remove || it.take == 0:
				t.items = append(t.items, it)
			}
		}
		if len(lost) == len(b.items) {
			s.mu.Unlock()
			return taken{}, missingItems(bin, lost)
		}
	}
	if remove && len(t.items) > 0 {
		t.id = id
		if t.id == 0 {
			t.id = newTakeID(s.takes)
		}
		tk := &take{bin: bin, expires: time.Now().Add(timeout)}
		for _, it := range t.items {
			it.take = t.id
			tk.ids = append(tk.ids, it.id)
		}
		s.takes[t.id] = tk
	}
	s.mu.Unlock()
	// The state read may include operations not yet durable: wait for them,
	// so that nothing a crash could undo is handed out.
	return t, s.waitRead(t.rev)
}

func newTakeID(inUse map[uint64]*take) uint64 {
	for {
		var b [8]byte
		rand.Read(b[:])
		id := binary.LittleEndian.Uint64(b[:])
		if id != 0 && inUse[id] == nil {
			return id
		}
	}
}

// ackTake removes the items of take id from their bin, durably, and
// returns the revision after. It fails with ErrExpired, removing nothing,
// if the take is gone (it expired, the node restarted) or any of its items
// left the bin meanwhile (a Put or Delete). A take acknowledged already
// returns nil again.
func (s *Store) ackTake(id uint64) (uint64, error) {
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return 0, err
	}
	if s.acked.has(id) {
		rev := s.rev
		s.mu.Unlock()
		return rev, s.waitRead(rev)
	}
	tk := s.takes[id]
	if tk == nil {
		s.mu.Unlock()
		return 0, errorf(ErrExpired, "the Get's items were given back before it was acknowledged (it took longer than %v, or the node restarted)", s.opts.GetTimeout)
	}
	held := 0
	if b := s.bins[tk.bin]; b != nil {
		for _, it := range b.items {
			if it.take == id {
				held++
			}
		}
	}
	if held != len(tk.ids) {
		s.dropTakeLocked(id)
		s.mu.Unlock()
		return 0, errorf(ErrExpired, "the bin %q changed (Put or Delete) before the Get was acknowledged", tk.bin)
	}
	rec := &record{Op: recGet, Name: tk.bin, IDs: tk.ids, Take: id}
	p, err := prepare(rec)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	s.rev++
	rec.Rev = s.rev
	dropped := s.commitLocked(rec, p)
	s.mu.Unlock()
	return rec.Rev, s.settle(rec.Rev, dropped)
}

// value returns an item's value as a TensorDict: inline ones decoded over
// their bytes (to be copied before anyone may write them), prefixes mapped
// read-only afresh (the caller closes them).
func (s *Store) value(it *item) (*tensordict.TensorDict, error) {
	if it.inline != nil {
		return decodeValue(it.inline)
	}
	td, err := tensordict.LoadMemmap(s.valuePath(it.id), tensordict.InRoot(s.root), tensordict.ReadOnly())
	if err != nil {
		return nil, s.closedErr(fmt.Errorf("store: value %016x: %w", it.id, err))
	}
	return td, nil
}

// values returns the items' values; on error it closes those made.
func (s *Store) values(items []*item, clone bool) ([]*tensordict.TensorDict, error) {
	out := make([]*tensordict.TensorDict, 0, len(items))
	for _, it := range items {
		td, err := s.value(it)
		if err == nil && clone && it.inline != nil {
			td, err = td.Clone()
		}
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		out = append(out, td)
	}
	return out, nil
}

// Get returns the bin's items, oldest first, and removes them: the bin
// then no longer exists (unless items were added meanwhile). An empty or
// absent bin returns no items and no error. Items kept inline come in Go
// memory; larger ones are read-only mappings of their prefixes, whose
// files the removal moves to trash/ and unlinks Options.TrashGrace later
// (on this machine a mapping stays valid after that too; on another over
// NFS it does not): Close every item when done. Items whose folder is
// missing are left in the bin; a bin holding only such items is ErrMissing.
func (s *Store) Get(ctx context.Context, bin string) ([]*tensordict.TensorDict, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := s.takeItems(bin, true, s.opts.GetTimeout)
		if err != nil || t.id == 0 {
			return nil, err
		}
		tds, err := s.values(t.items, false)
		if err != nil {
			s.mu.Lock()
			s.dropTakeLocked(t.id)
			s.mu.Unlock()
			return nil, err
		}
		_, err = s.ackTake(t.id)
		if err == nil {
			return tds, nil
		}
		closeAll(tds)
		if !errors.Is(err, ErrExpired) {
			return nil, err
		}
		// A Put or Delete replaced the items meanwhile: take again.
	}
}

// Peek returns the bin's items, oldest first, and keeps them, including
// those a Get holds for its acknowledgement. The items are copies, or
// read-only mappings (Get): Close every item when done. Items whose folder
// is missing are left out; a bin holding only such items is ErrMissing.
func (s *Store) Peek(ctx context.Context, bin string) ([]*tensordict.TensorDict, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t, err := s.takeItems(bin, false, 0)
	if err != nil {
		return nil, err
	}
	return s.values(t.items, true)
}

// List returns the number of items in each bin that has any, and the
// revision the counts are at (to Watch from).
func (s *Store) List(ctx context.Context) (map[string]int, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return nil, 0, err
	}
	out := make(map[string]int, len(s.bins))
	for name, b := range s.bins {
		out[name] = len(b.items)
	}
	rev := s.rev
	s.mu.Unlock()
	return out, rev, s.waitRead(rev)
}

// Delete removes the bin and its items and returns the revision after it.
// Deleting a bin that does not exist does nothing and returns the current
// revision (tensorshare's delete is a no-op then).
func (s *Store) Delete(ctx context.Context, bin string) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return s.deleteBin(bin, reqID{})
}

func (s *Store) deleteBin(bin string, req reqID) (uint64, error) {
	if err := CheckName(bin); err != nil {
		return 0, err
	}
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return 0, err
	}
	if e, done, err := s.seenLocked(req); err != nil || done {
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		return e.Rev, s.waitRead(e.Rev)
	}
	b := s.bins[bin]
	if b == nil {
		rev := s.rev
		s.mu.Unlock()
		return rev, s.waitRead(rev)
	}
	for _, it := range b.items {
		if it.take != 0 {
			s.dropTakeLocked(it.take)
		}
	}
	rec := &record{Op: recDelete, Name: bin, Req: req}
	p, err := prepare(rec)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	s.rev++
	rec.Rev = s.rev
	dropped := s.commitLocked(rec, p)
	s.mu.Unlock()
	return rec.Rev, s.settle(rec.Rev, dropped)
}
