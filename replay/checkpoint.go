package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
	"github.com/tensorwire/tensorwire/replay/internal/selector"
	"github.com/tensorwire/tensorwire/tensordict"
)

// MetaFile is the name, under a buffer's prefix, of its metadata: the
// configuration and the last checkpoint, as JSON (docs/replay.md). It is
// written atomically; its presence is what makes a folder a buffer.
const MetaFile = "replay.json"

const (
	metaFormat  = "tensorwire.replay"
	metaVersion = 1
)

// meta is MetaFile's content.
type meta struct {
	Format     string               `json:"format"`
	Version    int                  `json:"version"`
	ID         string               `json:"id"`
	Capacity   int                  `json:"capacity"`
	Schema     tensordict.RowSchema `json:"schema"` // null until the first batch
	Sampler    selector.Spec        `json:"sampler"`
	Writer     writerSpec           `json:"writer"`
	Limit      RateLimit            `json:"limit"`
	LeaseMS    int64                `json:"lease_ms"`
	MaxTimes   int                  `json:"max_times_sampled,omitempty"`
	TrajKey    []string             `json:"traj_key,omitempty"`
	RIDLimit   uint64               `json:"rid_limit,omitempty"` // above every reservation id handed out (Buffer.ridLimit); absent before
	Checkpoint *checkpoint          `json:"checkpoint,omitempty"`
}

// checkpoint is the state a restarted buffer cannot read from its slot
// table.
type checkpoint struct {
	Time     time.Time `json:"time"`
	Inserted int64     `json:"inserted"` // the rate limiter's counts
	Sampled  int64     `json:"sampled"`
	Size     int       `json:"size"` // transitions sampleable then (informative)
}

// metaLocked returns the buffer's metadata as JSON; b.mu is held.
func (b *Buffer) metaLocked() ([]byte, error) {
	return encodeMeta(b.id, b.cfg, b.schema, b.ridLimit, &checkpoint{
		Time: time.Now().UTC(), Inserted: b.limit.inserts, Sampled: b.limit.samples, Size: b.sel.Len(),
	})
}

// encodeMeta returns MetaFile's content for the buffer id of cfg, whose
// schema is schema (cfg.Schema is what it was created with), with
// reservation ids below ridLimit (0: not written), at cp.
func encodeMeta(id string, cfg Config, schema tensordict.RowSchema, ridLimit uint64, cp *checkpoint) ([]byte, error) {
	m := meta{
		Format: metaFormat, Version: metaVersion, ID: id, Capacity: cfg.Capacity, Schema: schema,
		Sampler: cfg.Sampler.spec, Writer: cfg.Writer.normal(), Limit: cfg.Limit,
		LeaseMS: cfg.Lease.Milliseconds(), MaxTimes: cfg.MaxTimesSampled, TrajKey: cfg.TrajKey,
		RIDLimit: ridLimit, Checkpoint: cp,
	}
	return json.MarshalIndent(m, "", "  ")
}

// ridBlock is how far raiseRIDLimit moves rid_limit ahead: one write of
// MetaFile every 65,536 reservations, and as many ids a reopened buffer
// skips at most.
const ridBlock = 1 << 16

// maxRID bounds reservation ids: a slot's seq holds one above rowBits.
const maxRID = 1<<(64-rowBits) - 1

// raiseRIDLimit moves the limit below which reservation ids are handed out
// a block past nextRID, and saves it in MetaFile (written, synced and
// renamed: atomicfile) before any id at the old limit is handed out; b.mu
// is held. On an error (a full disk) the limit stays, and reserve fails.
//
// Ids are not reused across Open so that a commit retried across a
// restart can never name another writer's reservation: a reservation
// whose slots a top-k writer all dropped leaves its id nowhere in the slot
// table, and a machine crash can lose the slot table's last writes. A
// persisted limit (not ids from the clock, or random high bits) keeps ids
// increasing, which a slot's seq needs: it is also the insertion order
// (FIFO, LIFO, episodes).
func (b *Buffer) raiseRIDLimit() error {
	if b.nextRID+ridBlock > maxRID {
		return fmt.Errorf("replay: %d reservation ids handed out; at most %d", b.nextRID, uint64(maxRID))
	}
	old := b.ridLimit
	b.ridLimit = b.nextRID + ridBlock
	if err := b.writeMetaLocked(); err != nil {
		b.ridLimit = old
		return err
	}
	return nil
}

// writeMetaLocked writes MetaFile; b.mu is held. It holds b.metaMu
// around the write, as every writer of MetaFile does.
func (b *Buffer) writeMetaLocked() error {
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	data, err := b.metaLocked()
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(b.prefix, MetaFile), data, 0o644); err != nil {
		return fmt.Errorf("replay: writing %s: %w", MetaFile, err)
	}
	return nil
}

func (b *Buffer) writeMeta() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.writeMetaLocked()
}

// Checkpoint makes the buffer durable against a machine crash: it flushes
// the storage and the slot table to disk, then writes MetaFile with the
// rate limiter's counts. Commits wait while it flushes; samples and writes
// into reserved slots go on.
//
// A buffer needs no checkpoint to survive its own process dying: the slot
// table and the storage are shared mappings, so every committed transition
// and its priority are in the page cache the moment Extend returns, and Open
// finds them. What a checkpoint adds is the disk, and the rate limiter's
// counts (which Open takes from the last checkpoint).
func (b *Buffer) Checkpoint(ctx context.Context) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.leave()
	if err := b.health(true); err != nil {
		return err
	}
	b.commitMu.Lock()
	defer b.commitMu.Unlock()
	b.mu.Lock()
	storage := b.storage
	b.mu.Unlock()
	if storage != nil {
		if err := storage.Flush(); err != nil {
			return fmt.Errorf("replay: checkpoint: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.slots.flush(); err != nil {
		return fmt.Errorf("replay: checkpoint: %w", err)
	}
	// Never write MetaFile into a folder that is no longer the buffer's.
	if err := b.health(true); err != nil {
		return err
	}
	// b.metaMu, held from the content to its write, keeps a reserve from
	// raising rid_limit in between, which this write would then undo.
	b.mu.Lock()
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	data, err := b.metaLocked()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(b.prefix, MetaFile), data, 0o644); err != nil {
		return fmt.Errorf("replay: checkpoint: %w", err)
	}
	return nil
}

// Open resumes the buffer at prefix, as Create or an earlier process left
// it: every transition committed before that process stopped (however it
// stopped) can be sampled again, with its priority; reservations it had
// not committed are dropped. ErrNotFound if prefix holds no buffer.
//
// The Buffer holds the prefix (LockFile) until Close: ErrInUse, naming the
// holder's pid and host, if another Buffer holds it, in this process or
// another.
func Open(prefix string) (*Buffer, error) {
	return OpenWith(prefix, nil)
}

// OpenWith is Open with some settings changed. change, when not nil, is
// given the buffer's configuration as its MetaFile has it (Config returns
// the same) and returns the configuration wanted, or an error that OpenWith
// returns. The settings that can change without touching what the buffer
// holds are applied and saved in MetaFile:
//
//   - Lease, for the reservations made from now on;
//   - Limit (the counts so far are kept);
//   - MaxTimesSampled (the counts start again);
//   - the parameters of a Prioritized sampler (alpha, beta; the sampler is
//     rebuilt from the priorities in the slot table).
//
// A change of anything else (Capacity, Writer, the sampler's kind, a
// Schema other than nil or the buffer's) is refused with ErrConfig naming
// the buffer's value and the one asked for. When change or the check fails,
// nothing at the prefix was modified.
func OpenWith(prefix string, change func(Config) (Config, error)) (*Buffer, error) {
	if err := refuseLinks(prefix, ErrConfig); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(prefix, MetaFile)); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNotFound, prefix)
	}
	lock, err := acquire(prefix)
	if err != nil {
		return nil, err
	}
	if err := refuseLinks(prefix, ErrConfig); err != nil { // planted while the lock was taken
		lock.Release()
		return nil, err
	}
	b, err := open(prefix, change)
	if err != nil {
		lock.Release()
		return nil, err
	}
	b.lock = lock
	return b, nil
}

// open is OpenWith once the prefix is held.
func open(prefix string, change func(Config) (Config, error)) (*Buffer, error) {
	metaPath := filepath.Join(prefix, MetaFile)
	data, err := os.ReadFile(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNotFound, prefix)
	}
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	m, cfg, err := parseMeta(data)
	if err != nil {
		return nil, fmt.Errorf("replay: %s: %w", metaPath, err)
	}
	changed := false
	if change != nil {
		want, err := change(cloneConfig(cfg))
		if err != nil {
			return nil, err
		}
		if err := want.validate(); err != nil {
			return nil, err
		}
		if err := changeable(cfg, want); err != nil {
			return nil, fmt.Errorf("%w (%s)", err, metaPath)
		}
		changed = want.Lease != cfg.Lease || want.Limit != cfg.Limit || want.Sampler != cfg.Sampler ||
			want.MaxTimesSampled != cfg.MaxTimesSampled
		cfg.Lease, cfg.Limit, cfg.Sampler = want.Lease, want.Limit, want.Sampler
		cfg.MaxTimesSampled = want.MaxTimesSampled
	}
	// The slot table first: it fails on a file too short for the capacity
	// before the sampler allocates for it.
	slots, err := openSlots(filepath.Join(prefix, SlotsFile), cfg.Capacity)
	if err != nil {
		return nil, fmt.Errorf("replay: opening the slot table: %w", err)
	}
	b := newBuffer(prefix, cfg, m.ID)
	b.slots = slots
	b.own(filepath.Join(prefix, SlotsFile))
	if cfg.Schema != nil {
		if err := b.loadStorage(); err != nil {
			b.slots.close()
			return nil, err
		}
	}
	if m.Checkpoint != nil {
		b.limit.inserts, b.limit.samples = m.Checkpoint.Inserted, m.Checkpoint.Sampled
	}
	b.recover()
	// Ids resume after every one handed out: those in the slot table
	// (recover) and those below the limit saved (none saved before
	// rid_limit was: only the slot table's then).
	b.nextRID = max(b.nextRID, m.RIDLimit)
	b.firstRID, b.ridLimit = b.nextRID, m.RIDLimit
	// A block of ids is saved now, while the disk has room if it ever
	// does, so that a buffer reopened on a full disk takes extends into its
	// preallocated storage as it did before rid_limit: only the next block
	// needs a write. On an error (a full disk, a read-only folder) the
	// first reserve tries again and fails with it.
	b.mu.Lock()
	saved := b.raiseRIDLimit() == nil
	b.mu.Unlock()
	if changed && !saved {
		if err := b.writeMeta(); err != nil {
			b.closeFiles()
			return nil, err
		}
	}
	return b, nil
}

// changeable checks that a buffer configured as have can be reopened as
// want (both normalised): only the settings OpenWith may change differ.
func changeable(have, want Config) error {
	switch {
	case want.Capacity != have.Capacity:
		return fmt.Errorf("%w: capacity %d asked for; the buffer's is %d, fixed when it was created",
			ErrConfig, want.Capacity, have.Capacity)
	case want.Sampler.spec.Kind != have.Sampler.spec.Kind:
		return fmt.Errorf("%w: sampler %s asked for; the buffer's is %s, a kind fixed when it was created",
			ErrConfig, want.Sampler, have.Sampler)
	case !want.Writer.equal(have.Writer):
		return fmt.Errorf("%w: writer %s asked for; the buffer's is %s, fixed when it was created",
			ErrConfig, want.Writer, have.Writer)
	case !slices.Equal(want.TrajKey, have.TrajKey):
		return fmt.Errorf("%w: trajectory key %q asked for; the buffer's is %q, fixed when it was created",
			ErrConfig, want.TrajKey, have.TrajKey)
	case want.Schema != nil && have.Schema == nil:
		return fmt.Errorf("%w: a schema asked for; the buffer's is set by its first batch", ErrConfig)
	case want.Schema != nil:
		if err := have.Schema.Match(want.Schema); err != nil {
			return fmt.Errorf("%w: the schema asked for differs from the buffer's: %v", ErrConfig, err)
		}
	}
	return nil
}

// parseMeta decodes and checks MetaFile's content.
func parseMeta(data []byte) (meta, Config, error) {
	var m meta
	if err := json.Unmarshal(data, &m); err != nil {
		return m, Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if m.Format != metaFormat || m.Version != metaVersion {
		return m, Config{}, fmt.Errorf("%w: format %q version %d, want %q version %d",
			ErrConfig, m.Format, m.Version, metaFormat, metaVersion)
	}
	if m.RIDLimit > maxRID {
		return m, Config{}, fmt.Errorf("%w: rid_limit %d; at most %d", ErrConfig, m.RIDLimit, uint64(maxRID))
	}
	cfg := Config{
		Capacity: m.Capacity, Schema: m.Schema.Clone(), Sampler: Sampler{m.Sampler}, Writer: Writer{m.Writer}, Limit: m.Limit,
		Lease: time.Duration(m.LeaseMS) * time.Millisecond, MaxTimesSampled: m.MaxTimes, TrajKey: m.TrajKey,
	}
	if err := cfg.validate(); err != nil {
		return m, Config{}, err
	}
	return m, cfg, nil
}

// loadStorage maps the storage of a buffer whose schema is known and checks
// that it is what MetaFile says.
func (b *Buffer) loadStorage() error {
	dir := filepath.Join(b.prefix, StorageDir)
	td, err := loadInFolder(b.prefix, dir)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	td.InPlace() // rewritten lap after lap: through the mapping (memmap.Tensor.InPlace)
	bs := td.BatchSize()
	if err := b.schema.Match(td.RowSchema()); err != nil || len(bs) != 1 || bs[0] != b.cfg.Capacity {
		td.Close()
		return fmt.Errorf("replay: %s does not hold what %s says (batch %v, want [%d]; %v)",
			dir, MetaFile, bs, b.cfg.Capacity, err)
	}
	b.storage = td
	b.ownStorage()
	return nil
}

// recover rebuilds the in-memory state from the slot table: committed slots
// go to the sampler (FIFO slots already handed out excepted), slots a
// writer held are emptied, and the writer resumes (newSlotChooser).
//
// A writing slot of a reservation some of whose slots are committed is
// committed too. Two ways leave one, and both want it:
//   - a commit cut short by the node dying (kill -9 while commit marked
//     its slots one by one; their priorities and keys were all written
//     first). Every row of its batch was written before the commit
//     began. Its writer had no reply and retries the commit, which finds
//     the slots committed and succeeds: the batch is in once. Emptied,
//     the slots left would have the retry fail with ErrExpired, the
//     writer extend the batch again, and the slots already marked hold
//     its first rows twice (the fault suite saw an episode's step twice).
//   - a reserve cut short between turning a committed slot writing and
//     giving it the new seq (reserve's order): the slot still holds, whole,
//     the row of the reservation its seq names, as before the reserve.
func (b *Buffer) recover() {
	finish := b.cutShort()
	var newest uint64 // the largest seq
	for s := b.cfg.Capacity - 1; s >= 0; s-- {
		w, seq := b.slots.word(s), b.slots.seq(s)
		newest = max(newest, seq)
		if state(w) == stateWriting && finish[b.slots.rid(s)] {
			w = makeWord(gen(w), stateCommitted)
			b.slots.setWord(s, w)
		}
		switch state(w) {
		case stateWriting:
			b.slots.setWord(s, makeWord(gen(w), stateEmpty))
		case stateCommitted:
			p := b.slots.priority(s)
			if p == consumed {
				break
			}
			if p < 0 || math.IsNaN(p) || math.IsInf(p, 0) {
				p = 1 // a corrupt priority: treat as new
			}
			b.selInsert(s, seq, p)
			b.maxPrio = max(b.maxPrio, p)
		}
	}
	b.nextRID = newest>>rowBits + 1
	b.writer = newSlotChooser(b.cfg.Writer, b.slots)
	b.rebuildEpisodes()
}

// cutShort returns the reservations recover finishes: those with a slot
// writing and one committed. The second pass over the table runs only if
// some slot is writing (a node that closed with no reservation in flight
// left none).
func (b *Buffer) cutShort() map[uint64]bool {
	writing := map[uint64]bool{}
	for s := range b.cfg.Capacity {
		if state(b.slots.word(s)) == stateWriting {
			writing[b.slots.rid(s)] = true
		}
	}
	finish := map[uint64]bool{}
	if len(writing) == 0 {
		return finish
	}
	for s := range b.cfg.Capacity {
		if rid := b.slots.rid(s); state(b.slots.word(s)) == stateCommitted && writing[rid] {
			finish[rid] = true
		}
	}
	return finish
}
