package replay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/lockfile"
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
	metaMu   sync.Mutex   // held around every write of MetaFile, from its content on; taken after mu, never before it
	use      sync.RWMutex // operations on the mappings outside mu hold it shared (enter); Close exclusively
	closed   atomic.Bool  // set under mu, by Close

	mu      sync.Mutex
	changed chan struct{}          // closed and replaced when anything a waiter waits for changes
	storage *tensordict.TensorDict // nil until the schema is known
	schema  tensordict.RowSchema   // per transition; nil until known
	slots   *slotTable
	sel     selector.Selector
	writer  slotChooser // set once the slot table is (Create, recover)
	limit   *limiter
	rng     *mrand.Rand
	maxPrio float64
	times   []int32       // MaxTimesSampled: times each sampleable slot was sampled; -1 if not sampleable
	left    int64         // MaxTimesSampled: samples the sampleable slots that can be picked can still give (count, uncount)
	eps     *episodeIndex // TrajKey: the episodes; nil without one
	nextRID uint64
	resv    map[uint64]*reservation
	pending int // slots held by reservations
	stats   Stats

	// ridLimit is above every rid handed out, and MetaFile says at least
	// it (rid_limit): reserve raises both before it hands out an id at it
	// (raiseRIDLimit), so that no process reopening the buffer, even
	// after a machine crash, hands an id out again.
	ridLimit uint64
	firstRID uint64      // the rids below were handed out by an earlier process (Open); 0 after Create
	expired  expiredRIDs // this Buffer's reservations that ended uncommitted, which commit tells from retries

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
	Sampler   string `codec:"sampler" json:"sampler"`     // the sampler, as Sampler.String writes it
	NodeHeap  uint64 `codec:"node_heap" json:"node_heap"` // Go heap in use on the node serving the buffer: its rpc.Stats.HeapBytes (remote Stats only)
}

// Create makes a new buffer at prefix, a folder that must not hold one
// already (ErrExists), and holds it (LockFile) until Close. With cfg.Schema
// the storage is created now, its disk space reserved; without, at the
// first Extend. Close it when done.
func Create(prefix string, cfg Config) (*Buffer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := refuseLinks(prefix, ErrExists); err != nil {
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
	if err := refuseLinks(prefix, ErrExists); err != nil { // planted while the lock was taken
		lock.Release()
		return nil, err
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
	b.writer = newSlotChooser(cfg.Writer, b.slots)
	b.ridLimit = b.nextRID + ridBlock // saved with the rest: the first block costs no write of its own
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
	var times []int32
	if cfg.MaxTimesSampled > 0 {
		times = make([]int32, cfg.Capacity)
		for i := range times {
			times[i] = -1
		}
	}
	var eps *episodeIndex
	if cfg.TrajKey != nil {
		eps = newEpisodeIndex(cfg.TrajKey, cfg.Capacity)
	}
	return &Buffer{
		eps:     eps,
		times:   times,
		prefix:  prefix,
		cfg:     cfg,
		id:      id,
		changed: make(chan struct{}),
		schema:  cfg.Schema,
		sel:     sel,
		limit:   newLimiter(cfg.Limit),
		rng:     mrand.New(mrand.NewChaCha8(seed)),
		maxPrio: 1,
		nextRID: 1,
		resv:    map[uint64]*reservation{},
	}
}

// createStorage makes the storage for a transition schema: a batch of
// Capacity transitions.
func (b *Buffer) createStorage(schema tensordict.RowSchema) error {
	td, err := schema.Create(filepath.Join(b.prefix, StorageDir), b.cfg.Capacity)
	if err != nil {
		return fmt.Errorf("replay: creating the storage: %w", err)
	}
	td.InPlace() // rewritten lap after lap: through the mapping (memmap.Tensor.InPlace)
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

// Prefix returns the folder the buffer lives in.
func (b *Buffer) Prefix() string { return b.prefix }

// Config returns the buffer's configuration: what Create was given (or
// OpenWith changed), with the defaults filled in, and the schema once
// known.
func (b *Buffer) Config() Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := cloneConfig(b.cfg)
	c.Schema = b.schema.Clone()
	return c
}

// Capacity returns how many transitions the buffer holds.
func (b *Buffer) Capacity() int { return b.cfg.Capacity }

// Schema returns the fields of one transition (shapes without the batch
// dimension), or nil before the first Extend of a buffer created without
// one. A scalar field's Shape is nil. The result is the caller's.
func (b *Buffer) Schema() tensordict.RowSchema {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.schema.Clone()
	for i := range s {
		if len(s[i].Shape) == 0 {
			s[i].Shape = nil // replay.info has always sent scalar shapes as nil
		}
	}
	return s
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
