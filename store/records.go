package store

import "fmt"

// The log's records as data. Each kind of record is one row of
// recordKinds: its op (the byte the log holds: never reused), what
// checkRecord requires of it beyond a good frame, and how apply changes
// the state and fills the record's event. The payload is the same
// msgpack record for every op (log.go), so a new kind of record is a
// row here with its check and apply, the record built where the
// operation is (bins.go, params.go), and, if it is an event, an Op
// (watch.go).

// Record ops.
const (
	recBase    = 1 // a compacted log's first record: the revision and counters it starts from
	recPut     = 2 // a bin's items replaced by Items
	recAppend  = 3 // Items added to a bin, in order (Append: one; Extend: several)
	recGet     = 4 // items IDs removed from a bin by the Get Take
	recDelete  = 5 // a bin removed
	recPublish = 6 // version Version of a parameter set, value Items[0]
)

// recordKind is what the store knows of one op.
type recordKind struct {
	op uint8
	// event is the Op of the event a record of this op makes, numbered:
	// it is in the history and may answer a request, and its Name is a
	// bin's or a parameter set's (CheckName). 0 for the base record, the
	// one that is no event. name is the Op's String.
	event Op
	name  string
	// check returns what makes rec a record no version of this package
	// writes, or "". nil: nothing beyond event's.
	check func(rec *record) string
	// apply changes the state as rec says, with s.mu held, and returns
	// the ids of the values it dropped; it fills what the event carries
	// beyond its Op, revision and name.
	apply func(s *Store, rec *record, ev *Event) (dropped []uint64)
}

// recordKinds lists every op.
var recordKinds = []recordKind{
	{op: recBase, check: checkBase, apply: (*Store).applyBase},
	{op: recPut, event: OpPut, name: "put", check: checkValues, apply: (*Store).applyPut},
	{op: recAppend, event: OpAppend, name: "append", check: checkValues, apply: (*Store).applyAppend},
	{op: recGet, event: OpGet, name: "get", apply: (*Store).applyGet},
	{op: recDelete, event: OpDelete, name: "delete", apply: (*Store).applyDelete},
	{op: recPublish, event: OpPublish, name: "publish", check: checkPublish, apply: (*Store).applyPublish},
}

func (o Op) String() string {
	for _, k := range recordKinds {
		if k.event == o && o != 0 {
			return k.name
		}
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// recordKindOf returns op's row, or nil for an op no version writes.
func recordKindOf(op uint8) *recordKind {
	for i := range recordKinds {
		if recordKinds[i].op == op {
			return &recordKinds[i]
		}
	}
	return nil
}

// checkRecord returns an error matching ErrCorrupt for a record apply
// cannot take: one no version of this package writes, whatever its
// checksum says.
func checkRecord(rec *record) error {
	bad := ""
	k := recordKindOf(rec.Op)
	switch {
	case k == nil:
		bad = fmt.Sprintf("op %d", rec.Op)
	case k.check != nil:
		bad = k.check(rec)
	}
	if bad == "" && k.event != 0 {
		if err := CheckName(rec.Name); err != nil {
			bad = err.Error()
		}
	}
	if bad != "" {
		return fmt.Errorf("%w: a record the store does not write: %s", ErrCorrupt, bad)
	}
	return nil
}

func checkBase(rec *record) string {
	if rec.Name == "" || rec.Rev != 0 {
		return "a base record without an id, or numbered"
	}
	return ""
}

// checkValues: a record of values has at least one, each with an id, and
// a parameter version's is not inline.
func checkValues(rec *record) string {
	bad := ""
	if len(rec.Items) == 0 {
		bad = "no value"
	}
	for _, it := range rec.Items {
		if it.ID == 0 || (rec.Op == recPublish && it.Inline != nil) {
			bad = "a value without an id, or a parameter version inline"
		}
	}
	return bad
}

func checkPublish(rec *record) string {
	if rec.Version == 0 {
		return "version 0"
	}
	return checkValues(rec)
}

// apply changes the state as rec says and returns the ids of the values
// it dropped (whose prefixes go once rec is durable). It serves both the
// live operations (after their checks, s.mu held) and Open's replay.
func (s *Store) apply(rec *record) (dropped []uint64) {
	for _, it := range rec.Items {
		if it.ID > s.nextID.Load() {
			s.nextID.Store(it.ID)
		}
	}
	k := recordKindOf(rec.Op)
	if k == nil {
		return nil // checkRecord refuses it
	}
	ev := Event{Revision: rec.Rev, Op: k.event, Name: rec.Name}
	dropped = k.apply(s, rec, &ev)
	if k.event != 0 && rec.Rev > 0 {
		s.rev = rec.Rev
		s.hist.add(ev)
		if rec.Req != (reqID{}) {
			s.reqs.add(reqEntry{ID: rec.Req, Rev: rec.Rev, Version: rec.Version})
		}
	}
	return dropped
}

func (s *Store) applyBase(rec *record, _ *Event) []uint64 {
	s.id = rec.Name
	s.rev = max(s.rev, rec.Version)
	s.hist.floor = max(s.hist.floor, rec.Version)
	if rec.NextID > s.nextID.Load() {
		s.nextID.Store(rec.NextID)
	}
	for _, t := range rec.Takes {
		s.acked.add(t)
	}
	for _, r := range rec.Reqs {
		s.reqs.add(r)
	}
	return nil
}

func (s *Store) applyPut(rec *record, ev *Event) (dropped []uint64) {
	if b := s.bins[rec.Name]; b != nil {
		dropped = s.dropItemsLocked(b.items)
	}
	b := &bin{}
	for _, it := range rec.Items {
		b.items = append(b.items, s.newItem(it))
	}
	s.setBin(rec.Name, b)
	ev.Items = len(b.items)
	return dropped
}

func (s *Store) applyAppend(rec *record, ev *Event) []uint64 {
	b := s.bins[rec.Name]
	if b == nil {
		b = &bin{}
		s.bins[rec.Name] = b
	}
	for _, it := range rec.Items {
		b.items = append(b.items, s.newItem(it))
	}
	ev.Items = len(b.items)
	return nil
}

func (s *Store) applyGet(rec *record, ev *Event) (dropped []uint64) {
	if b := s.bins[rec.Name]; b != nil {
		gone := make(map[uint64]bool, len(rec.IDs))
		for _, id := range rec.IDs {
			gone[id] = true
		}
		var keep, drop []*item
		for _, it := range b.items {
			if gone[it.id] {
				drop = append(drop, it)
			} else {
				keep = append(keep, it)
			}
		}
		b.items = keep
		dropped = s.dropItemsLocked(drop)
		s.setBin(rec.Name, b)
		ev.Items = len(keep)
	}
	if rec.Take != 0 {
		delete(s.takes, rec.Take)
		s.acked.add(rec.Take)
	}
	return dropped
}

func (s *Store) applyDelete(rec *record, _ *Event) (dropped []uint64) {
	if b := s.bins[rec.Name]; b != nil {
		dropped = s.dropItemsLocked(b.items)
		delete(s.bins, rec.Name)
	}
	return dropped
}

func (s *Store) applyPublish(rec *record, ev *Event) []uint64 {
	ev.Version = rec.Version
	ps := s.params[rec.Name]
	if ps == nil {
		ps = &paramSet{versions: map[uint64]*version{}}
		s.params[rec.Name] = ps
	}
	it := rec.Items[0]
	ps.versions[rec.Version] = &version{id: it.ID, size: it.Size, rev: rec.Rev}
	if rec.Version > ps.latest {
		if old := ps.versions[ps.latest]; old != nil {
			old.supersededAt = rec.Rev
		}
		ps.latest = rec.Version
		if s.pub != nil {
			close(s.pub)
			s.pub = nil
		}
	} else if rec.Rev == 0 {
		// A compacted log restates older live versions: superseded
		// by a durable record.
		ps.versions[rec.Version].supersededAt = 0
	}
	return nil
}
