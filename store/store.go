package store

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Store is a store of bins and parameter sets in a folder, served by one
// process (Open locks the folder). Its methods are safe for concurrent use;
// Close it when done. A Service serves it to other processes, which Dial
// it and make the same calls.
type Store struct {
	dir  string
	root *os.Root // dir: every file and folder of the store is reached through it, never by a link out of it
	opts Options
	lk   *lockfile.Lock
	log  *logWriter

	folders folderIDs // values/, staging/, trash/ as Open found them

	nextID atomic.Uint64 // the last value id handed out
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	id      string // random, made with the log: a new store has another
	rev     uint64 // the last revision given out
	durable uint64 // the last revision whose record is durable
	notify  chan struct{}
	bins    map[string]*bin
	params  map[string]*paramSet
	takes   map[uint64]*take
	acked   recentTakes
	dropped recentTakes // takes given back (ack Drop), made or not: never made after
	reqs    requests
	leases  map[uint64]*lease
	hist    history
	inline  int64              // bytes of inline values held
	maps    map[uint64]*mapped // read-only mappings of prefixes, for bytes responses
	trash   []trashed          // deleted values in trash/, waiting for Options.TrashGrace
	pub     chan struct{}      // closed at the next publication
}

// Open opens the store in the folder dir, creating it (and dir) if dir is
// missing or empty, and locks it: a second Open of the same folder, in this
// process or another, fails with ErrLocked until the first is closed or its
// process has died. A folder that holds files but is not a store, or whose
// store files are links, is refused (ErrExists), as is a store's folder
// whose log was deleted (ErrLost); nothing in it is touched.
//
// Opening replays the log, so every operation acknowledged before a crash
// is there. What the log and the folder disagree on is reported through
// Options.Logger and left as it is: values/ entries no record names (a
// crash between writing a value and logging it) stay, and items whose
// folder is missing are lost (ErrMissing when read), alone. Options.Repair
// drops both.
func Open(dir string, opts Options) (*Store, error) {
	o := opts.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// Check before making anything: a folder that is not a store's gets
	// not even a LOCK file.
	if _, err := checkLayout(abs); err != nil && !(errors.Is(err, ErrLost) && o.Repair) {
		return nil, err
	}
	// The folders made are synced into their parents: a new store's
	// folder, and so the operations acknowledged in it, survive a power
	// loss.
	if err := atomicfile.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil { // the folder itself may be a link
		return nil, fmt.Errorf("store: %w", err)
	}
	lk, err := lock(filepath.Join(abs, lockName))
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Store, error) {
		unlock(lk, filepath.Join(abs, lockName))
		return nil, err
	}
	hasLog, err := checkLayout(abs) // again, now that this process owns the folder
	if errors.Is(err, ErrLost) && o.Repair {
		o.Logger.Warn("store repair: store.log is missing; starting a new store there, dropping the values no record names",
			"path", filepath.Join(abs, logName), "was", err)
		err = nil
	}
	if err != nil {
		return fail(err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return fail(fmt.Errorf("store: %w", err))
	}
	for _, sub := range []string{valuesDir, stagingDir, trashDir} {
		if err := root.Mkdir(sub, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			root.Close()
			return fail(fmt.Errorf("store: %w", err))
		}
	}
	s := &Store{
		dir: abs, opts: o, lk: lk, done: make(chan struct{}), notify: make(chan struct{}),
		bins: map[string]*bin{}, params: map[string]*paramSet{}, takes: map[uint64]*take{},
		leases: map[uint64]*lease{}, maps: map[uint64]*mapped{},
		hist: history{max: o.History}, reqs: requests{clients: map[uint64]*clientReqs{}},
	}
	s.root = root
	if err := s.recover(hasLog); err != nil {
		root.Close()
		return fail(err)
	}
	s.wg.Add(3)
	go s.writeLoop()
	go func() {
		defer s.wg.Done()
		s.log.syncLoop()
	}()
	go s.sweepLoop()
	if o.Repair {
		if err := s.dropLost(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// recover opens or creates the log, replays it, and cleans the folder.
func (s *Store) recover(hasLog bool) error {
	s.scanTrash()
	path := filepath.Join(s.dir, logName)
	var f *os.File
	var err error
	if hasLog {
		f, err = s.root.OpenFile(logName, os.O_RDWR, 0)
	} else {
		f, err = s.createLog(path)
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	end, err := readLog(f, func(rec *record) error {
		if err := checkRecord(rec); err != nil {
			return err
		}
		s.apply(rec)
		return nil
	})
	if err != nil {
		f.Close()
		return err
	}
	if fi, err := f.Stat(); err == nil && fi.Size() > end {
		// A torn tail: records never acknowledged. Cut it off.
		if err := f.Truncate(end); err != nil {
			f.Close()
			return fmt.Errorf("store: cutting the log's torn tail: %w", err)
		}
	}
	if _, err := f.Seek(end, 0); err != nil {
		f.Close()
		return fmt.Errorf("store: %w", err)
	}
	if s.id == "" {
		f.Close()
		return fmt.Errorf("%w: %s has no base record", ErrCorrupt, path)
	}
	s.durable = s.rev
	s.log = newLogWriter(f, end, s.rev, s.opts.NoSync)
	s.log.check = s.checkLog
	s.log.advanced = s.advance
	s.log.stopped = func(err error) {
		s.opts.Logger.Error("store stopped: every call fails from now on", "dir", s.dir, "err", err)
	}
	if s.folders, err = statFolders(s.root); err != nil {
		f.Close()
		return err
	}
	// Every value a record names should be there; one that is not is
	// lost, alone (ErrMissing when read). Values no record names are left
	// alone unless Options.Repair.
	keep := map[uint64]bool{}
	for name, b := range s.bins {
		for _, it := range b.items {
			if it.inline == nil {
				keep[it.id] = true
				if s.valueGone(it.id) {
					it.lost = true
					s.opts.Logger.Error(lostItemMsg, "bin", name, "path", s.valuePath(it.id))
				}
			}
		}
	}
	grace := time.Now().Add(s.opts.LeaseTTL)
	for name, ps := range s.params {
		for v, ver := range ps.versions {
			keep[ver.id] = true
			ver.keepUntil = grace // readers of the last run may renew their leases
			if s.valueGone(ver.id) {
				if v != ps.latest {
					delete(ps.versions, v) // deleted before the crash
					continue
				}
				ver.lost = true
				s.opts.Logger.Error(lostVersionMsg, "parameters", name, "version", v, "path", s.valuePath(ver.id))
			}
		}
	}
	ents, err := fs.ReadDir(s.root.FS(), valuesDir)
	if err != nil {
		f.Close()
		return fmt.Errorf("store: %w", err)
	}
	for _, e := range ents {
		id, ok := parseValueName(e.Name())
		if ok && id > s.nextID.Load() {
			// A value renamed into place that its record never followed (a
			// kill -9 between the two): left alone, its id must not be
			// handed out again.
			s.nextID.Store(id)
		}
		if ok && !keep[id] {
			if s.opts.Repair {
				s.removeValue(id)
				s.opts.Logger.Warn("store repair: dropped a value folder no record names", "path", s.valuePath(id))
			} else {
				s.opts.Logger.Warn("store: a value folder no record names is left alone (Options.Repair, the node's --store NAME,repair=drop, drops it)",
					"path", s.valuePath(id))
			}
		}
	}
	s.sweepStaging(0)
	return nil
}

// createLog makes a new log with its base record.
func (s *Store) createLog(path string) (*os.File, error) {
	var b [8]byte
	rand.Read(b[:])
	p, err := prepare(&record{Op: recBase, Name: hex.EncodeToString(b[:])})
	if err != nil {
		return nil, err
	}
	data := append([]byte(logMagic), p.seal(0)...)
	if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
		return nil, err
	}
	removeLogTemps(filepath.Dir(path)) // an earlier try's, its process killed
	return os.OpenFile(path, os.O_RDWR, 0)
}

// Dir returns the store's folder, absolute.
func (s *Store) Dir() string { return s.dir }

// ID returns the store's identity: random, made when its log was created.
// A client that sees it change knows the store was created anew.
func (s *Store) ID() string { return s.id }

// Close stops the store: calls in progress and later ones fail with
// ErrClosed (operations already handed to the log are written first),
// mappings are closed, and the folder is unlocked.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.log.close()
	s.wg.Wait()
	s.mu.Lock()
	for id, m := range s.maps {
		m.td.Close()
		delete(s.maps, id)
	}
	s.mu.Unlock()
	err := s.log.f.Close()
	s.root.Close()
	if uerr := unlock(s.lk, filepath.Join(s.dir, lockName)); err == nil {
		err = uerr
	}
	return err
}

// enter returns ErrClosed once the store is closed, and the log's error
// once it failed; s.mu is held.
func (s *Store) enterLocked() error {
	if s.closed {
		return ErrClosed
	}
	return s.log.failed()
}

// commitLocked numbers the prepared record rec (Rev set by the caller to
// s.rev+1), applies it to the state and queues it for the log. s.mu is
// held. It returns the values the record dropped.
func (s *Store) commitLocked(rec *record, p prepared) []uint64 {
	dropped := s.apply(rec)
	s.log.enqueue(p.seal(rec.Rev), rec.Rev)
	return dropped
}

// settle waits until rev is durable, then deletes the prefixes of dropped
// values.
func (s *Store) settle(rev uint64, dropped []uint64) error {
	if err := s.log.wait(rev); err != nil {
		return err
	}
	for _, id := range dropped {
		s.trashValue(id)
	}
	return nil
}

// readRev returns the current revision, to wait for before reading state
// that includes operations not yet durable.
func (s *Store) waitRead(rev uint64) error { return s.log.wait(rev) }

// writeLoop writes the log: each batch of queued records with one write
// (the syncer makes them durable), and the whole state instead once the
// log is long enough to compact.
func (s *Store) writeLoop() {
	defer s.wg.Done()
	defer s.log.writerDone()
	var buf []byte
	var frames [][]byte
	for {
		batch, ok := s.log.next()
		if !ok {
			return
		}
		if s.shouldCompact() && s.log.waitSynced() == nil {
			rest, err := s.compact()
			if err == nil {
				continue
			}
			if s.log.failed() != nil {
				return // compact stopped the log: nothing more is written
			}
			batch = append(batch, rest...) // write them the ordinary way
		}
		if err := s.log.write(batch, &frames, &buf); err != nil {
			s.advance(0) // wake watchers: the store has failed
			return
		}
		if cap(buf) > 64<<20 {
			buf = nil
		}
	}
}

// advance records that rev is durable and wakes those waiting for events.
// A rev of 0 says the log stopped (it failed, or the store closes): then
// those waiting for a publication (WaitNewer) are woken too, to find the
// store's error, since no publication will come.
func (s *Store) advance(rev uint64) {
	s.mu.Lock()
	if rev > s.durable {
		s.durable = rev
	}
	close(s.notify)
	s.notify = make(chan struct{})
	if rev == 0 && s.pub != nil {
		close(s.pub)
		s.pub = nil
	}
	s.mu.Unlock()
}

func (s *Store) shouldCompact() bool {
	s.log.mu.Lock()
	size := s.log.size
	s.log.mu.Unlock()
	if size < s.opts.CompactBytes {
		return false
	}
	s.mu.Lock()
	live := s.inline
	s.mu.Unlock()
	return size > 2*live
}

// compact rewrites the log as the state: a base record and records that
// restate every bin and parameter version, written to a new file that
// replaces the log. The records queued meanwhile are part of that state,
// so they are dropped from the queue; if compaction fails they are
// returned, to be written the ordinary way. The new log's revision is
// made durable (logWriter.madeDurable) before it returns.
func (s *Store) compact() ([]queued, error) {
	s.mu.Lock()
	s.log.mu.Lock()
	rest := s.log.queue
	s.log.queue = nil
	s.log.mu.Unlock()
	recs := s.stateRecords()
	rev := s.rev
	s.mu.Unlock()

	tmp := logName + ".compact"
	f, err := s.root.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return rest, err
	}
	fail := func(err error) ([]queued, error) {
		f.Close()
		s.root.Remove(tmp)
		return rest, err
	}
	size := int64(len(logMagic))
	if _, err := f.Write([]byte(logMagic)); err != nil {
		return fail(err)
	}
	for _, rec := range recs {
		p, err := prepare(rec)
		if err != nil {
			return fail(err)
		}
		fr := p.seal(rec.Rev)
		if _, err := f.Write(fr); err != nil {
			return fail(err)
		}
		size += int64(len(fr))
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	// The rename and the switch of files are one step under the log's
	// lock, so that health never sees store.log and the file it writes
	// disagree when nothing was removed. The folder is synced before
	// the switch: until then a power loss may bring the old log back, so
	// nothing only the new file holds is acknowledged (madeDurable), and
	// no later record is written to it and acknowledged by its fsync.
	s.log.mu.Lock()
	if err := s.root.Rename(tmp, logName); err != nil {
		s.log.mu.Unlock()
		return fail(err)
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		// store.log is the new file, whose entry may not survive a power
		// loss: the store cannot say what is durable, and stops.
		s.log.mu.Unlock()
		f.Close()
		err = errorf(ErrFailed, "compacting the log: syncing %s after the rename: %v", s.dir, err)
		s.log.fail(err)
		s.advance(0) // wake watchers: the store has failed
		return nil, err
	}
	old := s.log.f
	s.log.f, s.log.size = f, size
	s.log.written = max(s.log.written, rev)
	s.log.mu.Unlock()
	s.log.madeDurable(rev)
	s.log.wake()
	old.Close()
	return nil, nil
}

// stateRecords returns records that rebuild the current state; s.mu is
// held. Inline bytes are shared, not copied: values never change.
func (s *Store) stateRecords() []*record {
	recs := []*record{{Op: recBase, Rev: 0, Name: s.id, Version: s.rev, NextID: s.nextID.Load(),
		Takes: s.acked.list(), Reqs: s.reqs.list()}}
	for _, name := range slices.Sorted(mapsKeys(s.bins)) {
		b := s.bins[name]
		op, chunk, size := uint8(recPut), []recItem(nil), 0
		for _, it := range b.items {
			chunk = append(chunk, it.rec())
			size += len(it.inline) + 32
			if size > 64<<20 {
				recs = append(recs, &record{Op: op, Name: name, Items: chunk})
				op, chunk, size = recAppend, nil, 0
			}
		}
		if len(chunk) > 0 || op == recPut {
			recs = append(recs, &record{Op: op, Name: name, Items: chunk})
		}
	}
	for _, name := range slices.Sorted(mapsKeys(s.params)) {
		ps := s.params[name]
		for _, v := range slices.Sorted(mapsKeys(ps.versions)) {
			ver := ps.versions[v]
			recs = append(recs, &record{Op: recPublish, Name: name, Version: v, Items: []recItem{{ID: ver.id, Size: ver.size}}})
		}
	}
	return recs
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// sweepLoop expires Gets and leases, deletes parameter versions nobody
// holds, and removes abandoned staged prefixes.
func (s *Store) sweepLoop() {
	defer s.wg.Done()
	every := min(s.opts.GetTimeout, s.opts.LeaseTTL) / 4
	every = max(min(every, time.Second), 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	lastStaging := time.Now()
	for {
		select {
		case <-s.done:
			return
		case now := <-t.C:
			if s.health() != nil {
				continue // stopped: nothing more to delete or expire
			}
			s.expire(now)
			s.sweepTrash(now)
			s.closeIdleMappings(now, mappingIdle)
			if now.Sub(lastStaging) > StagingTTL/10 {
				s.sweepStaging(StagingTTL)
				lastStaging = now
			}
		}
	}
}

// expire ends Gets and leases past their time and deletes the parameter
// versions that frees.
func (s *Store) expire(now time.Time) {
	s.mu.Lock()
	for id, tk := range s.takes {
		if now.After(tk.expires) {
			s.dropTakeLocked(id)
		}
	}
	for id, l := range s.leases {
		if !l.expires.IsZero() && now.After(l.expires) {
			s.releaseLocked(id)
		}
	}
	gone := s.collectLocked(now)
	s.mu.Unlock()
	for _, id := range gone {
		s.trashValue(id)
	}
}

// setBin stores b under name, or removes the bin when it is empty: an
// empty bin does not exist (tensorshare's list after get).
func (s *Store) setBin(name string, b *bin) {
	if len(b.items) == 0 {
		delete(s.bins, name)
		return
	}
	s.bins[name] = b
}

func (s *Store) newItem(r recItem) *item {
	s.inline += int64(len(r.Inline))
	return &item{id: r.ID, size: r.Size, inline: r.Inline}
}

// dropItemsLocked forgets items and returns the ids of those kept as
// prefixes.
func (s *Store) dropItemsLocked(items []*item) []uint64 {
	var ids []uint64
	for _, it := range items {
		s.inline -= int64(len(it.inline))
		if it.inline == nil {
			ids = append(ids, it.id)
		}
	}
	return ids
}

// mapping returns a read-only mapping of the prefix of value id, kept
// until the value is deleted or the store closed. Responses sent as bytes
// read it; a response still being written when the value is deleted fails
// (the mapping's reads return ErrClosed) instead of reading freed memory.
func (s *Store) mapping(id uint64) (*tensordict.TensorDict, error) {
	s.mu.Lock()
	if m := s.maps[id]; m != nil {
		m.used = time.Now()
		s.mu.Unlock()
		return m.td, nil
	}
	s.mu.Unlock()
	td, err := tensordict.LoadMemmap(s.valuePath(id), tensordict.InRoot(s.root), tensordict.ReadOnly())
	if err != nil {
		return nil, s.closedErr(fmt.Errorf("store: value %016x: %w", id, err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		td.Close()
		return nil, ErrClosed
	}
	if old := s.maps[id]; old != nil {
		td.Close()
		old.used = time.Now()
		return old.td, nil
	}
	s.maps[id] = &mapped{td: td, used: time.Now()}
	return td, nil
}

// mapped is a prefix the node keeps mapped, and when a response last took
// it.
type mapped struct {
	td   *tensordict.TensorDict
	used time.Time
}

// mappingIdle is how long a mapping stays unused before the sweep closes
// it, bounding the files the node keeps open to the values read in that
// time. A response still reading one after that long fails (its reads
// return ErrClosed), and its caller asks again.
const mappingIdle = 5 * time.Minute

// closeIdleMappings closes the mappings unused since before now-idle.
func (s *Store) closeIdleMappings(now time.Time, idle time.Duration) {
	s.mu.Lock()
	var idleOnes []*tensordict.TensorDict
	for id, m := range s.maps {
		if now.Sub(m.used) > idle {
			idleOnes = append(idleOnes, m.td)
			delete(s.maps, id)
		}
	}
	s.mu.Unlock()
	for _, td := range idleOnes {
		td.Close()
	}
}

func (s *Store) unmap(id uint64) {
	s.mu.Lock()
	m := s.maps[id]
	delete(s.maps, id)
	s.mu.Unlock()
	if m != nil {
		m.td.Close()
	}
}

// Stats are a store's figures at one moment.
type Stats struct {
	Revision    uint64 `codec:"revision"`     // the last revision
	Bins        int    `codec:"bins"`         // bins holding items
	Items       int    `codec:"items"`        // items in all bins
	InlineBytes int64  `codec:"inline_bytes"` // bytes of inline values held in memory
	Params      int    `codec:"params"`       // parameter sets
	Versions    int    `codec:"versions"`     // parameter versions on disk
	Leases      int    `codec:"leases"`       // readers' leases on versions
	Gets        int    `codec:"gets"`         // remote Gets waiting for their acknowledgement
	LogBytes    int64  `codec:"log_bytes"`    // the log file's length
	Missing     int    `codec:"missing"`      // items and versions whose folder is missing (ErrMissing), found so far
	Stopped     string `codec:"stopped"`      // why the store refuses every call (ErrFailed, ErrLost); "" while it works
}

// Stats returns the store's figures.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{Revision: s.rev, Bins: len(s.bins), InlineBytes: s.inline, Params: len(s.params),
		Leases: len(s.leases), Gets: len(s.takes)}
	for _, b := range s.bins {
		st.Items += len(b.items)
		for _, it := range b.items {
			if it.lost {
				st.Missing++
			}
		}
	}
	for _, ps := range s.params {
		st.Versions += len(ps.versions)
		for _, ver := range ps.versions {
			if ver.lost {
				st.Missing++
			}
		}
	}
	s.mu.Unlock()
	s.log.mu.Lock()
	st.LogBytes = s.log.size
	if s.log.err != nil {
		st.Stopped = s.log.err.Error()
	}
	s.log.mu.Unlock()
	return st
}
