package replay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/replay/internal/selector"
	"github.com/tensorwire/tensorwire/tensordict"
)

// LockFile is the name, under a buffer's prefix, of its lock file: the
// Buffer that has the buffer open holds an exclusive lock on it, which the
// kernel drops when its process dies (internal/lockfile). The file holds
// the pid, host and program of the last holder; a second Open or Create is
// refused with ErrInUse naming them.
const LockFile = "replay.lock"

// StorageDir is the folder, under a buffer's prefix, of its storage: a
// memory-mapped TensorDict of batch size [Capacity] in tensordict's format,
// which Python loads with TensorDict.load_memmap.
const StorageDir = "storage"

// Buffer is a replay buffer in one process: transitions in a memory-mapped
// TensorDict of fixed capacity at a prefix, a writer policy choosing their
// slots, a sampler choosing what a sample returns, and a rate limiter. Serve
// it on a node with Register for writers and trainers elsewhere (Dial).
//
// Every method is safe for concurrent use by many writers and samplers.
// Copies into and out of the storage run outside the buffer's lock, so
// writers and samplers copy in parallel; a row that a writer overwrites
// while a sampler copies it is detected by its slot's generation and
// sampled again, never returned torn.
//
// A Buffer owns its mappings until Close. Its prefix holds everything it
// needs to resume (Open): the storage, the slot table (SlotsFile), and
// replay.json with its configuration and last checkpoint. It owns the
// prefix too: one Buffer at a time, in one process, holds its LockFile,
// from Create or Open until Close.
type Buffer struct {
	prefix string
	cfg    Config
	id     string
	lock   *lockfile.Lock

	commitMu sync.RWMutex // commits hold it shared; Checkpoint exclusively, around its flushes
	use      sync.RWMutex // operations on the mappings outside mu hold it shared (enter); Close exclusively
	closed   atomic.Bool  // set under mu, by Close

	mu      sync.Mutex
	changed chan struct{}          // closed and replaced when anything a waiter waits for changes
	storage *tensordict.TensorDict // nil until the schema is known
	schema  []tensordict.Field     // per transition; nil until known
	slots   *slotTable
	sel     selector.Selector
	writer  slotChooser
	limit   *limiter
	rng     *mrand.Rand
	maxPrio float64
	nextRID uint64
	resv    map[uint64]*reservation
	pending int // slots held by reservations
	stats   Stats

	// lost is set, once, when the buffer's files are found deleted,
	// replaced or truncated under it (health); every call but Stats
	// and Close fails with it from then on.
	lost      error
	files     []ownedFile // the files the buffer maps
	checkedAt time.Time   // when every file was last checked
}

// ownedFile is a file a buffer maps, as it was when mapped.
type ownedFile struct {
	path string
	fi   os.FileInfo
}

// reservation is slots taken for a writer that has not committed yet.
type reservation struct {
	rid   uint64
	slots []int // per row of the batch; -1 for a row the writer policy dropped
	keys  []float64
	timer *time.Timer
}

// Stats counts what a buffer has done since it was created or opened.
type Stats struct {
	// StorageLost says why the buffer stopped, when its files were found
	// deleted, replaced or truncated under it (ErrStorageLost); "" while
	// they are in place.
	StorageLost string `codec:"storage_lost" json:"storage_lost,omitempty"`

	Capacity  int    `codec:"capacity" json:"capacity"`
	Size      int    `codec:"size" json:"size"`           // transitions that can be sampled
	Inserted  int64  `codec:"inserted" json:"inserted"`   // transitions committed (cumulative, as the rate limiter counts)
	Sampled   int64  `codec:"sampled" json:"sampled"`     // transitions sampled (cumulative)
	Pending   int    `codec:"pending" json:"pending"`     // slots held by uncommitted reservations
	Expired   int64  `codec:"expired" json:"expired"`     // reservations that expired
	Resampled int64  `codec:"resampled" json:"resampled"` // rows found overwritten while sampled, and sampled again
	Sampler   string `codec:"sampler" json:"sampler"`
	NodeHeap  uint64 `codec:"node_heap" json:"node_heap"` // Go heap in use on the node serving the buffer (remote Stats only)
}

// Create makes a new buffer at prefix, a folder that must not hold one
// already (ErrExists), and holds it (LockFile) until Close. With cfg.Schema
// the storage is created now, its disk space reserved; without, at the
// first Extend. Close it when done.
func Create(prefix string, cfg Config) (*Buffer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(prefix, MetaFile)); err == nil {
		return nil, fmt.Errorf("%w: %s", ErrExists, prefix)
	}
	if err := checkDisk(prefix, cfg); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(prefix)
	made := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	lock, err := acquire(prefix)
	if err != nil {
		// Another Create may be filling the folder: remove it only if
		// this one made it and it is still empty.
		if made {
			os.Remove(prefix)
		}
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(prefix, MetaFile)); err == nil {
		lock.Release()
		return nil, fmt.Errorf("%w: %s", ErrExists, prefix)
	}
	// undo gives back the space a failed Create took (a full disk is the
	// usual cause): the folder if Create made it, else what it wrote; and
	// lets the prefix go.
	undo := func() {
		if made {
			os.RemoveAll(prefix)
		} else {
			os.Remove(filepath.Join(prefix, SlotsFile))
			os.RemoveAll(filepath.Join(prefix, StorageDir))
			os.Remove(filepath.Join(prefix, LockFile))
		}
		lock.Release()
	}
	var idb [8]byte
	rand.Read(idb[:])
	b := newBuffer(prefix, cfg, hex.EncodeToString(idb[:]))
	if b.slots, err = createSlots(filepath.Join(prefix, SlotsFile), cfg.Capacity); err != nil {
		undo()
		return nil, fmt.Errorf("replay: creating the slot table: %w", err)
	}
	b.own(filepath.Join(prefix, SlotsFile))
	if cfg.Schema != nil {
		if err := b.createStorage(cfg.Schema); err != nil {
			b.slots.close()
			undo()
			return nil, err
		}
	}
	if b.cfg.Writer.Kind == "top_k" {
		free := make([]int, cfg.Capacity)
		for i := range free {
			free[i] = cfg.Capacity - 1 - i
		}
		b.writer = newTopK(free)
	}
	if err := b.writeMeta(); err != nil {
		b.closeFiles()
		undo()
		return nil, err
	}
	b.lock = lock
	return b, nil
}

// acquire takes the lock of the buffer at prefix, or fails with ErrInUse
// naming its holder.
func acquire(prefix string) (*lockfile.Lock, error) {
	l, err := lockfile.Acquire(filepath.Join(prefix, LockFile))
	var held *lockfile.HeldError
	if errors.As(err, &held) {
		return nil, &inUseError{prefix: prefix, held: held}
	}
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return l, nil
}

// inUseError is ErrInUse with the holder lockfile found.
type inUseError struct {
	prefix string
	held   *lockfile.HeldError
}

func (e *inUseError) Error() string {
	return fmt.Sprintf("%v by %s: %s", ErrInUse, e.held.Holder(), e.prefix)
}

func (e *inUseError) Unwrap() []error { return []error{ErrInUse, e.held} }

func newBuffer(prefix string, cfg Config, id string) *Buffer {
	sel, _ := selector.New(cfg.Sampler.spec, cfg.Capacity) // validated
	var seed [32]byte
	rand.Read(seed[:])
	return &Buffer{
		prefix:  prefix,
		cfg:     cfg,
		id:      id,
		changed: make(chan struct{}),
		schema:  cfg.Schema,
		sel:     sel,
		writer:  &roundRobin{capacity: cfg.Capacity},
		limit:   newLimiter(cfg.Limit),
		rng:     mrand.New(mrand.NewChaCha8(seed)),
		maxPrio: 1,
		nextRID: 1,
		resv:    map[uint64]*reservation{},
	}
}

// createStorage makes the storage for a transition schema.
func (b *Buffer) createStorage(schema []tensordict.Field) error {
	fs := make([]tensordict.Field, len(schema))
	for i, f := range schema {
		fs[i] = tensordict.Field{Key: f.Key, DType: f.DType, Shape: append([]int{b.cfg.Capacity}, f.Shape...)}
	}
	td, err := tensordict.Create(filepath.Join(b.prefix, StorageDir), []int{b.cfg.Capacity}, fs...)
	if err != nil {
		return fmt.Errorf("replay: creating the storage: %w", err)
	}
	b.storage, b.schema = td, schema
	b.ownStorage()
	return nil
}

// own records path as a file the buffer maps, to be checked (health).
func (b *Buffer) own(path string) {
	if fi, err := os.Stat(path); err == nil {
		b.files = append(b.files, ownedFile{path: path, fi: fi})
	}
}

// ownStorage records the storage's files.
func (b *Buffer) ownStorage() {
	for _, t := range b.storage.Leaves() {
		if p := t.Path(); p != "" {
			b.own(p)
		}
	}
}

// checkEvery is how often, at most, calls check every file of a buffer;
// in between they check only its lock file, one stat.
const checkEvery = time.Second

// health returns the error the buffer fails calls with once its files are
// lost (ErrStorageLost, for good), or nil. It checks the lock file every
// time, one stat: the folder deleted or moved is found by the next call.
// It checks every file the buffer maps, for being deleted, replaced or
// truncated, when full is set and otherwise at most every checkEvery.
// b.mu is not held: the stats run outside it.
func (b *Buffer) health(full bool) error {
	b.mu.Lock()
	lost, files := b.lost, b.files
	all := full || time.Since(b.checkedAt) >= checkEvery
	if all {
		b.checkedAt = time.Now()
	}
	b.mu.Unlock()
	if lost != nil {
		return lost
	}
	cause := b.checkFiles(files, all)
	if cause == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.loseLocked(cause)
}

// healthLocked is health(true) with b.mu held, for a reserve that found
// every slot held.
func (b *Buffer) healthLocked() error {
	if b.lost != nil {
		return b.lost
	}
	b.checkedAt = time.Now()
	if cause := b.checkFiles(b.files, true); cause != nil {
		return b.loseLocked(cause)
	}
	return nil
}

// checkFiles returns why the buffer's files are lost, or nil: its lock
// file, and files too when all is set.
func (b *Buffer) checkFiles(files []ownedFile, all bool) error {
	if b.lock != nil {
		if err := b.lock.Check(); err != nil {
			return fmt.Errorf("its folder or lock file was deleted, moved or replaced (%w)", err)
		}
	}
	if !all {
		return nil
	}
	for _, f := range files {
		fi, err := os.Stat(f.path)
		switch {
		case err != nil:
			return err
		case !os.SameFile(fi, f.fi):
			return fmt.Errorf("%s was replaced by another file", f.path)
		case fi.Size() < f.fi.Size():
			return fmt.Errorf("%s was truncated to %d bytes from %d", f.path, fi.Size(), f.fi.Size())
		}
	}
	return nil
}

// loseLocked makes the buffer fail every call from now on with
// ErrStorageLost for cause, and wakes the calls waiting; b.mu is held.
func (b *Buffer) loseLocked(cause error) error {
	if b.lost == nil {
		b.lost = fmt.Errorf("%w: %s: %w", ErrStorageLost, b.prefix, cause)
		b.broadcast()
	}
	return b.lost
}

// noteFault checks the buffer's files after err, a fault on the mappings:
// it returns the buffer's ErrStorageLost if they were lost (a file
// truncated under the mapping), and err otherwise. A fault alone is not a
// loss: writing into a hole of a sparse file on a full disk faults too,
// and works again once there is room.
func (b *Buffer) noteFault(err error) error {
	if !errors.Is(err, memmap.ErrFault) {
		return err
	}
	if lost := b.health(true); lost != nil {
		return lost
	}
	return err
}

// Prefix returns the folder the buffer lives in.
func (b *Buffer) Prefix() string { return b.prefix }

// Config returns the buffer's configuration: what Create was given (or
// OpenWith changed), with the defaults filled in, and the schema once
// known.
func (b *Buffer) Config() Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := cloneConfig(b.cfg)
	c.Schema = cloneSchema(b.schema)
	return c
}

// Capacity returns how many transitions the buffer holds.
func (b *Buffer) Capacity() int { return b.cfg.Capacity }

// Schema returns the fields of one transition (shapes without the batch
// dimension), or nil before the first Extend of a buffer created without
// one.
func (b *Buffer) Schema() []tensordict.Field {
	b.mu.Lock()
	defer b.mu.Unlock()
	return cloneSchema(b.schema)
}

// Stats returns the buffer's counters now; ErrClosed after Close. It checks
// the buffer's files first, and reports them lost in StorageLost.
func (b *Buffer) Stats() (Stats, error) {
	if b.closed.Load() {
		return Stats{}, ErrClosed
	}
	lost := b.health(true)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return Stats{}, ErrClosed
	}
	s := b.stats
	if lost != nil {
		s.StorageLost = lost.Error()
	}
	s.Capacity, s.Size, s.Pending, s.Sampler = b.cfg.Capacity, b.sel.Len(), b.pending, b.cfg.Sampler.String()
	s.Inserted, s.Sampled = b.limit.inserts, b.limit.samples
	return s, nil
}

// Len returns the number of transitions that can be sampled.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sel.Len()
}

// Extend adds a batch of transitions, a TensorDict of batch size [B] whose
// tensors match the buffer's schema (the first batch sets it when the
// buffer has none), and returns the slot each went to (-1 for a
// transition a top-k writer dropped). It waits while the rate limiter holds
// inserts back, until ctx ends. A batch that does not match is refused
// with ErrSchema and nothing is written.
//
// New transitions get the largest priority seen so far; ExtendPriority sets
// theirs.
func (b *Buffer) Extend(ctx context.Context, td *tensordict.TensorDict) ([]int, error) {
	return b.ExtendPriority(ctx, td, nil)
}

// ExtendPriority is Extend with a priority for each transition (nil: the
// largest seen so far), finite and not negative.
func (b *Buffer) ExtendPriority(ctx context.Context, td *tensordict.TensorDict, priorities []float64) ([]int, error) {
	n, keys, err := checkExtend(td, priorities, b.cfg.Writer)
	if err != nil {
		return nil, err
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.leave()
	r, storage, err := b.reserve(ctx, rowSchema(td), n, keys)
	if err != nil {
		return nil, err
	}
	if err := writeRows(storage, r.slots, td); err != nil {
		b.expire(r.rid)
		return nil, b.noteFault(err)
	}
	return b.commit(r.rid, r.slots, priorities)
}

// writeRows writes td's rows into storage at slots, skipping rows whose slot
// is -1 (a top-k writer dropped them).
func writeRows(storage *tensordict.TensorDict, slots []int, td *tensordict.TensorDict) error {
	if !slices.Contains(slots, -1) {
		return storage.SetRows(slots, td)
	}
	var kept, rows []int
	for i, s := range slots {
		if s >= 0 {
			kept = append(kept, s)
			rows = append(rows, i)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	src, err := td.Gather(rows)
	if err != nil {
		return err
	}
	return storage.SetRows(kept, src)
}

// batchLen checks that td is a batch of transitions and returns its length.
func batchLen(td *tensordict.TensorDict) (int, error) {
	if td == nil {
		return 0, schemaErrorf("no batch")
	}
	bs := td.BatchSize()
	if len(bs) != 1 {
		return 0, schemaErrorf("batch size %v, want [N]", bs)
	}
	if bs[0] == 0 {
		return 0, schemaErrorf("empty batch")
	}
	return bs[0], nil
}

func checkPriorities(p []float64, n int) error {
	if p == nil {
		return nil
	}
	if len(p) != n {
		return schemaErrorf("%d priorities for %d transitions", len(p), n)
	}
	for i, v := range p {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return schemaErrorf("priority %d is %v; want a finite number >= 0", i, v)
		}
	}
	return nil
}

// checkExtend checks a batch and its priorities before an Extend, and
// returns its length and, for a top-k writer, its transitions' keys.
func checkExtend(td *tensordict.TensorDict, priorities []float64, w Writer) (n int, keys []float64, err error) {
	if n, err = batchLen(td); err != nil {
		return 0, nil, err
	}
	if err := checkPriorities(priorities, n); err != nil {
		return 0, nil, err
	}
	if w.Kind == "top_k" {
		if keys, err = rankKeys(td, w.Key); err != nil {
			return 0, nil, err
		}
	}
	return n, keys, nil
}

// rankKeys reads the ranking key of each row of td: a tensor at key with one
// element per row.
func rankKeys(td *tensordict.TensorDict, key []string) ([]float64, error) {
	t, err := td.Tensor(key...)
	if err != nil {
		return nil, schemaErrorf("the top-k writer ranks by %v: %v", key, err)
	}
	n := t.Len()
	if t.NumElements() != n {
		return nil, schemaErrorf("the top-k key %v has shape %v; want one element per transition", key, t.Shape())
	}
	raw, err := t.Bytes()
	if err != nil {
		return nil, err
	}
	keys := make([]float64, n)
	size := t.DType().Size()
	for i := range keys {
		keys[i] = t.DType().Float64(raw[i*size : (i+1)*size])
		if math.IsNaN(keys[i]) {
			return nil, schemaErrorf("top-k key of transition %d is NaN", i)
		}
	}
	return keys, nil
}

// reserve takes slots for n transitions of the given schema, creating the
// storage if the buffer has none, once the rate limiter lets them in.
// The slots leave the sampler at once, and their words move to a new
// generation, so samplers reading them see the change.
func (b *Buffer) reserve(ctx context.Context, schema []tensordict.Field, n int, keys []float64) (*reservation, *tensordict.TensorDict, error) {
	if n > b.cfg.Capacity || n > 1<<rowBits {
		return nil, nil, schemaErrorf("a batch of %d transitions does not fit a buffer of %d (or is over %d)", n, b.cfg.Capacity, 1<<rowBits)
	}
	if (keys != nil || b.cfg.Writer.Kind == "top_k") && len(keys) != n {
		return nil, nil, schemaErrorf("%d keys for %d transitions (the writer is %s)", len(keys), n, b.cfg.Writer.Kind)
	}
	for i, k := range keys {
		if math.IsNaN(k) {
			return nil, nil, schemaErrorf("top-k key of transition %d is NaN", i)
		}
	}
	if err := b.health(false); err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.schema == nil {
		if err := checkSchema(schema); err != nil {
			return nil, nil, schemaErrorf("%v", err)
		}
		if b.closed.Load() {
			return nil, nil, ErrClosed
		}
		if err := b.createStorage(schema); err != nil {
			return nil, nil, err
		}
		if err := b.writeMetaLocked(); err != nil {
			return nil, nil, err
		}
	} else if err := sameSchema(b.schema, schema); err != nil {
		return nil, nil, schemaErrorf("%v", err)
	}
	for !b.closed.Load() && b.lost == nil && !b.limit.canInsert(n, b.pending, b.sel.Len()) {
		if err := b.wait(ctx); err != nil {
			return nil, nil, err
		}
	}
	if b.closed.Load() {
		return nil, nil, ErrClosed
	}
	if b.lost != nil {
		return nil, nil, b.lost
	}
	slots, err := b.writer.choose(b.slots, n, keys)
	if errors.Is(err, ErrFull) {
		// Slots held by writers that cannot write them (the storage was
		// truncated under them) would end here too: say so if it is that.
		if lost := b.healthLocked(); lost != nil {
			return nil, nil, lost
		}
	}
	if err != nil {
		return nil, nil, err
	}
	r := &reservation{rid: b.nextRID, slots: slots, keys: keys}
	b.nextRID++
	for row, s := range slots {
		if s < 0 {
			continue
		}
		b.sel.Remove(s)
		w := b.slots.word(s)
		b.slots.setWord(s, makeWord(gen(w)+1, stateWriting))
		b.slots.setSeq(s, r.rid, row)
		b.pending++
	}
	b.resv[r.rid] = r
	r.timer = time.AfterFunc(b.cfg.Lease, func() { b.expire(r.rid) })
	return r, b.storage, nil
}

// commit makes a reservation's slots sampleable, with priorities (nil: the
// largest seen so far). slots is what the writer was given; if the
// reservation is gone, commit succeeds only if those slots already hold it
// committed (a retried commit), and fails with ErrExpired otherwise.
func (b *Buffer) commit(rid uint64, slots []int, priorities []float64) ([]int, error) {
	// Nothing is acknowledged once the files are gone.
	if err := b.health(false); err != nil {
		return nil, err
	}
	b.commitMu.RLock()
	defer b.commitMu.RUnlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if b.lost != nil {
		return nil, b.lost
	}
	r := b.resv[rid]
	if r == nil {
		if b.alreadyCommitted(rid, slots) {
			return slots, nil
		}
		return nil, fmt.Errorf("%w: reservation %d", ErrExpired, rid)
	}
	if priorities != nil && len(priorities) != len(r.slots) {
		return nil, schemaErrorf("%d priorities for %d transitions", len(priorities), len(r.slots))
	}
	r.timer.Stop()
	delete(b.resv, rid)
	n := 0
	for i, s := range r.slots {
		if s < 0 {
			continue
		}
		p := b.maxPrio
		if priorities != nil {
			p = priorities[i]
			b.maxPrio = max(b.maxPrio, p)
		}
		key := 0.0
		if r.keys != nil {
			key = r.keys[i]
		}
		b.slots.setPriority(s, p)
		b.slots.setKey(s, key)
		b.slots.setWord(s, makeWord(gen(b.slots.word(s)), stateCommitted))
		b.sel.Insert(s, b.slots.seq(s), p)
		b.writer.committed(s, key)
		n++
	}
	b.pending -= n
	b.limit.inserted(n)
	b.broadcast()
	return r.slots, nil
}

func (b *Buffer) alreadyCommitted(rid uint64, slots []int) bool {
	any := false
	for _, s := range slots {
		if s < 0 {
			continue
		}
		if s >= b.cfg.Capacity || b.slots.rid(s) != rid || state(b.slots.word(s)) != stateCommitted {
			return false
		}
		any = true
	}
	return any
}

// expire gives an uncommitted reservation's slots back: empty, never to be
// sampled until written again.
func (b *Buffer) expire(rid uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.resv[rid]
	if r == nil || b.closed.Load() {
		return
	}
	r.timer.Stop()
	delete(b.resv, rid)
	for _, s := range r.slots {
		if s < 0 {
			continue
		}
		b.slots.setWord(s, makeWord(gen(b.slots.word(s)), stateEmpty))
		b.writer.expired(s)
		b.pending--
	}
	b.stats.Expired++
	b.broadcast()
}

// SampleInfo describes the transitions a sample returned, row by row.
type SampleInfo struct {
	Indices []int `codec:"indices"` // their slots
	// IDs are their slots' generations: how many times a writer had taken
	// each slot when it was sampled. A slot overwritten since has another;
	// UpdatePriority skips a row whose slot's generation is no longer its
	// ID. (A generation is the slot table's word without its state bits,
	// word>>2; docs/replay.md.)
	IDs     []uint64  `codec:"ids"`
	Weights []float64 `codec:"weights"` // importance weights (prioritized sampling; 1 otherwise)
}

// Sample returns n transitions chosen by the buffer's sampler, copied into
// a new TensorDict in Go memory, and what they are (SampleInfo). It waits
// while the buffer cannot give n (fewer than the rate limiter's MinSize,
// an empty buffer, a FIFO buffer with fewer than n) until ctx ends.
//
// n must be positive and at most 2^20 (ErrArgument), and the rows it takes
// at most 1 GiB.
func (b *Buffer) Sample(ctx context.Context, n int) (*tensordict.TensorDict, SampleInfo, error) {
	if err := checkSampleSize(n); err != nil {
		return nil, SampleInfo{}, err
	}
	if err := b.waitSchema(ctx); err != nil {
		return nil, SampleInfo{}, err
	}
	schema := b.Schema()
	if bytes := int64(n) * int64(rowBytes(schema)); bytes > maxSampleBytes {
		return nil, SampleInfo{}, argumentErrorf("a sample of %d transitions is %d bytes; at most %d in one call", n, bytes, int64(maxSampleBytes))
	}
	return sampleNew(ctx, schema, n, b.SampleInto)
}

// sampleNew is a Sample of n transitions of schema: SampleInto into a new
// batch.
func sampleNew(ctx context.Context, schema []tensordict.Field, n int,
	sampleInto func(context.Context, *tensordict.TensorDict) (SampleInfo, error)) (*tensordict.TensorDict, SampleInfo, error) {
	dst, err := newBatch(schema, n)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	info, err := sampleInto(ctx, dst)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	return dst, info, nil
}

// SampleInto is Sample into dst, a TensorDict with the buffer's schema and
// batch size [n] (from an earlier Sample, say), without allocating it.
func (b *Buffer) SampleInto(ctx context.Context, dst *tensordict.TensorDict) (SampleInfo, error) {
	n, err := batchLen(dst)
	if err != nil {
		return SampleInfo{}, err
	}
	if err := b.enter(); err != nil {
		return SampleInfo{}, err
	}
	defer b.leave()
	var info SampleInfo
	if err := b.pick(ctx, n, &info); err != nil {
		return SampleInfo{}, err
	}
	b.mu.Lock()
	storage := b.storage
	b.mu.Unlock()
	resampled, err := gatherChecked(storage, b.slots, dst, &info, func(k int) (SampleInfo, error) {
		var more SampleInfo
		err := b.pick(ctx, k, &more)
		return more, err
	})
	if resampled > 0 {
		b.mu.Lock()
		b.stats.Resampled += int64(resampled)
		b.mu.Unlock()
	}
	if err != nil {
		return SampleInfo{}, b.noteFault(err)
	}
	return info, nil
}

// enter marks an operation that uses the mappings outside b.mu, so Close
// waits for it before unmapping; it fails once the buffer is closed.
// leave ends it.
func (b *Buffer) enter() error {
	b.use.RLock()
	if b.closed.Load() {
		b.use.RUnlock()
		return ErrClosed
	}
	return nil
}

func (b *Buffer) leave() { b.use.RUnlock() }

// changed returns which of rows (all of info's when all is set) have a slot
// whose word is no longer the one info recorded: committed, in the
// generation that is the row's ID.
func changed(slots *slotTable, info *SampleInfo, rows []int, all bool) []int {
	var out []int
	if all {
		for i, s := range info.Indices {
			if slots.word(s) != makeWord(info.IDs[i], stateCommitted) {
				out = append(out, i)
			}
		}
		return out
	}
	for _, i := range rows {
		if slots.word(info.Indices[i]) != makeWord(info.IDs[i], stateCommitted) {
			out = append(out, i)
		}
	}
	return out
}

// maxResamples bounds how often a sample replaces rows overwritten while it
// copied them, before it gives up with ErrContended.
const maxResamples = 16

// gatherChecked copies the rows info names from storage into dst, then
// checks their words in the slot table; rows whose word changed (a writer
// took the slot while they were copied) are replaced by rows from more,
// and those are checked in turn. info is updated to describe what dst holds.
//
// It returns how many rows it replaced.
func gatherChecked(storage *tensordict.TensorDict, slots *slotTable, dst *tensordict.TensorDict, info *SampleInfo,
	more func(k int) (SampleInfo, error)) (resampled int, err error) {
	if err := storage.GatherInto(dst, info.Indices); err != nil {
		return 0, err
	}
	// A row whose word held after it was copied was copied whole, whatever
	// happens to its slot later: only rows copied since the last check are
	// checked.
	var torn []int // the rows copied again in the last round; nil at first
	for round := range maxResamples {
		fence()
		if torn = changed(slots, info, torn, round == 0); len(torn) == 0 {
			return resampled, nil
		}
		resampled += len(torn)
		again, err := more(len(torn))
		if err != nil {
			return resampled, err
		}
		rows, err := storage.Gather(again.Indices)
		if err != nil {
			return resampled, err
		}
		if err := dst.SetRows(torn, rows); err != nil {
			return resampled, err
		}
		for j, i := range torn {
			info.Indices[i], info.IDs[i], info.Weights[i] = again.Indices[j], again.IDs[j], again.Weights[j]
		}
	}
	return resampled, fmt.Errorf("%w; %d attempts", ErrContended, maxResamples)
}

// pick chooses n committed slots, waiting until the buffer can give them,
// and records them and their words in info.
func (b *Buffer) pick(ctx context.Context, n int, info *SampleInfo) error {
	if err := checkSampleSize(n); err != nil {
		return err
	}
	if err := b.health(false); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.closed.Load() && b.lost == nil && !(b.storage != nil && b.limit.canSample(n, b.sel.Len()) && b.sel.CanSelect(n)) {
		if err := b.wait(ctx); err != nil {
			return err
		}
	}
	if b.closed.Load() {
		return ErrClosed
	}
	if b.lost != nil {
		return b.lost
	}
	start := len(info.Indices)
	var err error
	info.Indices, info.Weights, err = b.sel.Select(b.rng, n, info.Indices, info.Weights)
	if err != nil {
		return err
	}
	info.IDs = slices.Grow(info.IDs, n)
	for _, s := range info.Indices[start:] {
		info.IDs = append(info.IDs, gen(b.slots.word(s))) // committed: the sampler holds only those
	}
	if b.cfg.Sampler.spec.Kind == "fifo" {
		for _, s := range info.Indices[start:] {
			b.slots.setPriority(s, consumed)
		}
	}
	b.limit.sampled(n)
	b.broadcast()
	return nil
}

// checkSampleSize checks the size of a sample asked for.
func checkSampleSize(n int) error {
	if n <= 0 {
		return argumentErrorf("batch size must be positive, not %d", n)
	}
	if n > maxSample {
		return argumentErrorf("batch size %d; at most %d in one call", n, maxSample)
	}
	return nil
}

// Bounds on one sample, which a remote caller could otherwise make the
// node allocate without limit.
const (
	maxSample      = 1 << rowBits // transitions
	maxSampleBytes = 1 << 30      // bytes of rows, when they are copied out
)

// rowBytes returns the bytes of one transition of schema.
func rowBytes(schema []tensordict.Field) int {
	n := 0
	for _, f := range schema {
		n += memmap.RowBytes(f.DType, append([]int{1}, f.Shape...))
	}
	return n
}

// consumed is the priority a FIFO buffer gives a slot it has handed out, so
// that a reopened buffer does not hand it out again.
const consumed = -1

// waitSchema waits until the buffer knows its schema.
func (b *Buffer) waitSchema(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.schema == nil && !b.closed.Load() && b.lost == nil {
		if err := b.wait(ctx); err != nil {
			return err
		}
	}
	if b.closed.Load() {
		return ErrClosed
	}
	return b.lost
}

// newBatch returns a zeroed TensorDict in Go memory for n transitions of
// schema.
func newBatch(schema []tensordict.Field, n int) (*tensordict.TensorDict, error) {
	td, err := tensordict.New(n)
	if err != nil {
		return nil, err
	}
	for _, f := range schema {
		t, err := tensordict.Zeros(f.DType, append([]int{n}, f.Shape...)...)
		if err != nil {
			return nil, err
		}
		if err := td.SetPath(f.Key, t); err != nil {
			return nil, err
		}
	}
	return td, nil
}

// UpdatePriority sets the priorities of sampled transitions, row by row of
// info (Indices, and IDs when set), and returns how many it updated: a row
// whose slot has been overwritten since it was sampled (its generation is
// no longer the row's ID) is skipped. With IDs nil, the slots are updated whatever they hold.
// Priorities are finite and not negative. Samplers other than Prioritized
// keep the priorities but do not use them.
func (b *Buffer) UpdatePriority(ctx context.Context, info SampleInfo, priorities []float64) (int, error) {
	if err := checkPriorities(priorities, len(info.Indices)); err != nil {
		return 0, err
	}
	if priorities == nil && len(info.Indices) > 0 {
		return 0, schemaErrorf("no priorities")
	}
	if info.IDs != nil && len(info.IDs) != len(info.Indices) {
		return 0, schemaErrorf("%d ids for %d indices", len(info.IDs), len(info.Indices))
	}
	for i, s := range info.Indices {
		if s < 0 || s >= b.cfg.Capacity {
			return 0, schemaErrorf("index %d is %d; the buffer holds %d", i, s, b.cfg.Capacity)
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := b.health(false); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, ErrClosed
	}
	n := 0
	for i, s := range info.Indices {
		w := b.slots.word(s)
		if state(w) != stateCommitted || (info.IDs != nil && gen(w) != info.IDs[i]) {
			continue
		}
		if b.slots.priority(s) == consumed {
			continue
		}
		b.slots.setPriority(s, priorities[i])
		b.sel.Update(s, priorities[i])
		b.maxPrio = max(b.maxPrio, priorities[i])
		n++
	}
	return n, nil
}

// wait releases b.mu until something changes or ctx ends; b.mu is held
// again when it returns. A ctx that ends gives ctx's error.
func (b *Buffer) wait(ctx context.Context) error {
	ch := b.changed
	b.mu.Unlock()
	defer b.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// broadcast wakes every waiter; b.mu is held.
func (b *Buffer) broadcast() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Close checkpoints the buffer, waits for the calls using its mappings to
// return, and unmaps it; waiting calls return ErrClosed, and so do later
// calls. The files stay: Open resumes the buffer.
func (b *Buffer) Close() error {
	if b.closed.Load() {
		return nil
	}
	err := b.Checkpoint(context.Background())
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return nil
	}
	b.closed.Store(true)
	for _, r := range b.resv {
		r.timer.Stop()
	}
	b.broadcast()
	b.mu.Unlock()
	b.use.Lock() // wait for the operations in flight
	defer b.use.Unlock()
	return errors.Join(err, b.closeFiles())
}

// closeFiles unmaps the storage and the slot table and lets the prefix
// go.
func (b *Buffer) closeFiles() error {
	var errs []error
	if b.storage != nil {
		errs = append(errs, b.storage.Close())
	}
	errs = append(errs, b.slots.close())
	if b.lock != nil {
		errs = append(errs, b.lock.Release())
	}
	return errors.Join(errs...)
}

func cloneSchema(fs []tensordict.Field) []tensordict.Field {
	if fs == nil {
		return nil
	}
	out := make([]tensordict.Field, len(fs))
	for i, f := range fs {
		out[i] = tensordict.Field{Key: append([]string(nil), f.Key...), DType: f.DType, Shape: append([]int(nil), f.Shape...)}
	}
	return out
}
