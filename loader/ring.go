package loader

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/internal/slots"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The files of a ring folder (Config.Dir), docs/loader.md "Files".
const (
	// MetaFile describes the folder's producer: its dataset, seed, the
	// last epoch it began and its current ring. Its presence makes the
	// folder a loader's.
	MetaFile = "loader.json"
	// LockFile is the producer's lock: one producer per folder.
	LockFile = "loader.lock"
	// StorageDir, in a ring, is the TensorDict of batch size
	// [Slots × Batch] that holds the batches: slot s is rows
	// [s×Batch, (s+1)×Batch).
	StorageDir = "storage"
	// SlotsFile, in a ring, is the slot table: uint64 [Slots, 4].
	SlotsFile = "slots.memmap"
)

// ringPrefix starts the name of a ring's folder: ring-<id>.
const ringPrefix = "ring-"

// A slot's record in the slot table: its word (internal/slots), then the
// batch it holds.
const (
	fieldSeq   = 1 // the batch's sequence number, counted over every epoch
	fieldEpoch = 2 // its epoch
	fieldRows  = 3 // its rows
	numFields  = 4
)

// Slot states, the low two bits of a slot's word.
const (
	stateEmpty     = 0 // never written
	stateWriting   = 1 // the producer is writing a batch into it
	statePublished = 2 // holds a whole batch, announced to the consumers
)

// ringMeta is MetaFile's content.
type ringMeta struct {
	Version int    `json:"version"`
	Dataset string `json:"dataset"` // absolute
	Seed    uint64 `json:"seed"`
	Epoch   int64  `json:"epoch"` // the last epoch begun; -1 before any
	Ring    string `json:"ring"`  // the current ring's folder, under Dir
}

// ring is a producer's ring: the batches' storage and the slot table, in
// Dir/ring-<id>, and the folder's lock.
type ring struct {
	dir   string // Config.Dir, absolute
	id    string
	path  string // dir/ring-<id>
	lock  *lockfile.Lock
	meta  ringMeta
	store *tensordict.TensorDict // batch size [slots*batch], mapped read-write
	table *slots.Table
	slots int
	batch int
}

// openRing takes the folder dir for a producer of cfg (defaults applied)
// whose batches have fields: it checks that the folder is a loader's or
// empty, takes its lock, removes the rings of earlier producers and
// creates a new one. The epoch to begin with comes from the folder's
// MetaFile when it was written for the same dataset and seed.
func openRing(cfg Config, schema tensordict.RowSchema) (*ring, error) {
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: ring folder %s: %w", ErrConfig, cfg.Dir, err)
	}
	dataset := "producer=" + ProducerRemote // a producer process's: it resumes after the last epoch begun
	if cfg.Producer != ProducerRemote {
		if dataset, err = filepath.Abs(cfg.Dataset); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrDataset, err)
		}
	}
	if err := checkRingDir(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("loader: ring folder: %w", err)
	}
	lock, err := lockfile.Acquire(filepath.Join(dir, LockFile))
	var held *lockfile.HeldError
	if errors.As(err, &held) {
		return nil, &inUseError{dir: dir, held: held}
	}
	if err != nil {
		return nil, fmt.Errorf("loader: %w", err)
	}
	r := &ring{dir: dir, lock: lock, slots: cfg.Slots, batch: cfg.Batch}
	fail := func(err error) (*ring, error) {
		r.close(true)
		return nil, err
	}
	r.meta = ringMeta{Version: 1, Dataset: dataset, Seed: cfg.Seed, Epoch: -1}
	if old, err := readMeta(dir); err == nil && old.Dataset == dataset && old.Seed == cfg.Seed {
		r.meta.Epoch = old.Epoch
	}
	if err := r.writeMeta(); err != nil { // marks the folder a loader's before anything is made in it
		return fail(err)
	}
	if err := removeRings(dir); err != nil {
		return fail(err)
	}
	var b [8]byte
	rand.Read(b[:])
	r.id = hex.EncodeToString(b[:])
	r.meta.Ring = ringPrefix + r.id
	r.path = filepath.Join(dir, r.meta.Ring)
	if err := os.Mkdir(r.path, 0o755); err != nil {
		return fail(fmt.Errorf("loader: %w", err))
	}
	if r.store, err = schema.Create(filepath.Join(r.path, StorageDir), cfg.Slots*cfg.Batch); err != nil {
		return fail(fmt.Errorf("loader: creating the ring: %w", err))
	}
	if r.table, err = slots.Create(filepath.Join(r.path, SlotsFile), cfg.Slots, numFields); err != nil {
		return fail(fmt.Errorf("loader: creating the slot table: %w", err))
	}
	// The ring's pages into the page tables now, not one fault at a time in
	// the first lap of writes (96 against 24 ms for 154 MB on /dev/shm). A
	// hint: where it cannot, the first lap pays as before.
	if err := r.store.Prefault(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		cfg.Log.Debug("loader: prefaulting the ring", "err", err)
	}
	if err := r.writeMeta(); err != nil {
		return fail(err)
	}
	return r, nil
}

// checkRingDir refuses a folder that exists and holds anything but a
// loader's files: MetaFile, LockFile, rings and MetaFile's temporary
// files; or, without MetaFile, anything but LockFile (a producer that died
// between taking the lock and writing MetaFile, which it writes before it
// makes anything else). A symbolic link among them is refused, naming it:
// a producer follows no link in its folder (it removes rings, and writes
// and maps its own).
func checkRingDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: ring folder: %w", ErrConfig, err)
	}
	ours := false
	for _, e := range entries {
		ours = ours || e.Name() == MetaFile
		if e.Type()&fs.ModeSymlink != 0 {
			p := filepath.Join(dir, e.Name())
			target, _ := os.Readlink(p)
			return fmt.Errorf("%w: %s is a symbolic link (to %s): a loader follows no link in its ring folder; "+
				"remove it, or give the loader a folder of its own", ErrExists, p, target)
		}
	}
	var others []string
	for _, e := range entries {
		name := e.Name()
		mine := name == MetaFile || name == LockFile ||
			(ours && (strings.HasPrefix(name, "."+MetaFile+".tmp-") || strings.HasPrefix(name, ringPrefix) && e.IsDir()))
		if !mine {
			others = append(others, name)
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("%w: %s holds %s, which a loader did not make; give the loader a folder of its own",
			ErrExists, dir, strings.Join(others[:min(len(others), 3)], ", "))
	}
	return nil
}

// removeRings removes the rings of earlier producers in dir, through an
// os.Root on it: an entry that is not a folder (a symbolic link named
// ring-<id> among them) is left, and nothing is removed through a link,
// however one is planted meanwhile. Consumers of theirs that still map
// them keep their mappings (the files go when the last is closed).
func removeRings(dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	defer root.Close()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("loader: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		fi, err := root.Lstat(name)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, ringPrefix) && fi.IsDir():
			if err := root.RemoveAll(name); err != nil {
				return fmt.Errorf("loader: removing an old ring: %w", err)
			}
		case strings.HasPrefix(name, "."+MetaFile+".tmp-") && fi.Mode().IsRegular():
			root.Remove(name)
		}
	}
	return nil
}

// readMeta reads dir's MetaFile. A file that does not parse, or whose
// last epoch begun is out of range (below -1, or the last int64, after
// which no epoch can begin), is an error: openRing does not resume from
// it.
func readMeta(dir string) (ringMeta, error) {
	var m ringMeta
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, err
	}
	if m.Epoch < -1 || m.Epoch == math.MaxInt64 {
		return m, fmt.Errorf("loader: %s says epoch %d was begun last", MetaFile, m.Epoch)
	}
	return m, nil
}

// writeMeta replaces MetaFile atomically.
func (r *ring) writeMeta() error {
	b, err := json.MarshalIndent(r.meta, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(r.dir, MetaFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("loader: writing %s: %w", MetaFile, err)
	}
	return nil
}

// slotView returns the rows [0, rows) of slot s of the storage.
func (r *ring) slotView(s, rows int) (*tensordict.TensorDict, error) {
	return r.store.Slice(s*r.batch, s*r.batch+rows)
}

// close unmaps the ring and releases the lock; remove also removes the
// ring's folder (MetaFile stays, for the next producer to resume from).
func (r *ring) close(remove bool) error {
	var errs []error
	if r.table != nil {
		errs = append(errs, r.table.Close())
	}
	if r.store != nil {
		errs = append(errs, r.store.Close())
	}
	if remove && r.path != "" {
		errs = append(errs, os.RemoveAll(r.path))
	}
	errs = append(errs, r.lock.Release())
	return errors.Join(errs...)
}

// inUseError is ErrInUse with the holder lockfile found.
type inUseError struct {
	dir  string
	held *lockfile.HeldError
}

func (e *inUseError) Error() string {
	return fmt.Sprintf("%v by %s: %s", ErrInUse, e.held.Holder(), e.dir)
}

func (e *inUseError) Unwrap() []error { return []error{ErrInUse, e.held} }

// ringReader is a consumer's read-only mapping of a producer's ring.
type ringReader struct {
	store  *tensordict.TensorDict // the ring's storage, mapped
	joined *tensordict.TensorDict // store's tensors of the joined schema only: what views show
	leaves []*memmapLeaf          // in the schema's order
	table  *slots.Table
	batch  int

	mu      sync.Mutex
	views   int  // views of the mapping handed out and not yet done with (Options.Views)
	closing bool // close was called: the last view unmaps
	closed  bool
}

// unchanged reports whether a's slot still holds the batch a announced,
// after the reads before it (a fence, then the slot's word): ErrDropped,
// saying the batch was overwritten while what, if the producer rewrote it.
func (r *ringReader) unchanged(a announcement, while string) error {
	slots.Fence()
	if w := r.table.Word(a.Slot); w != a.Word {
		return wrapf(ErrDropped, "batch %d of epoch %d was overwritten while %s (word %#x, announced %#x)",
			a.Index, a.Epoch, while, w, a.Word)
	}
	return nil
}

// memmapLeaf is a ring tensor's mapping and its offset in it.
type memmapLeaf struct {
	mm  *memmap.Tensor
	off int64
}

// openRingReader maps the ring at path (a ring-<id> folder) read-only and
// checks it has fields for slots × batch rows. A link in the way is an
// error naming it.
func openRingReader(path string, schema tensordict.RowSchema, nslots, batch int) (*ringReader, error) {
	// No link is followed: neither the ring's folder, its storage or its
	// slot table, nor a file in the storage that leads out of the ring.
	for _, p := range []string{path, filepath.Join(path, StorageDir), filepath.Join(path, SlotsFile)} {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			return nil, fmt.Errorf("loader: %s is a symbolic link (to %s): a consumer maps no ring through a link", p, target)
		}
	}
	root, err := os.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	store, err := tensordict.LoadMemmap(filepath.Join(path, StorageDir), tensordict.ReadOnly(), tensordict.InRoot(root))
	if err != nil {
		return nil, err
	}
	r := &ringReader{store: store, batch: batch}
	if r.joined, err = tensordict.New(store.BatchSize()...); err != nil {
		r.close()
		return nil, err
	}
	if store.Len() != nslots*batch {
		r.close()
		return nil, fmt.Errorf("loader: the ring at %s has %d rows, want %d", path, store.Len(), nslots*batch)
	}
	for _, f := range schema {
		t, err := store.Tensor(f.Key...)
		if err != nil {
			r.close()
			return nil, err
		}
		mm, off := t.Mapping()
		if mm == nil || t.DType() != f.DType || t.RowBytes() != rowBytes(f) || !slices.Equal(t.Shape()[1:], f.Shape) {
			// The row shape too, not only its bytes: a view of a ring laid
			// out [32] for a schema of [2 4 4] would be a batch not of the
			// schema joined (FuzzConsumer).
			r.close()
			return nil, fmt.Errorf("loader: the ring's %s is %v %v, want %v", strings.Join(f.Key, "/"), t.DType(), t.Shape(), f)
		}
		r.leaves = append(r.leaves, &memmapLeaf{mm: mm, off: off})
		// A field the storage has beyond the schema is not the consumer's:
		// the copying path never reads it, and neither does a view.
		if err := r.joined.SetPath(f.Key, t); err != nil {
			r.close()
			return nil, err
		}
	}
	if r.table, err = slots.OpenReadOnly(filepath.Join(path, SlotsFile), nslots, numFields); err != nil {
		r.close()
		return nil, err
	}
	// The mapping's pages into this process's page tables now, not in the
	// first epoch's reads (a hint, as the producer's: see openRing).
	_ = store.Prefault()
	return r, nil
}

// acquire counts a view of the mapping handed out: the mapping stays until
// it is done with (done). False once close was called.
func (r *ringReader) acquire() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return false
	}
	r.views++
	return true
}

// done says a view acquire counted is no longer read; the last one after
// close unmaps.
func (r *ringReader) done() {
	r.mu.Lock()
	r.views--
	last := r.closing && r.views == 0 && !r.closed
	if last {
		r.closed = true
	}
	r.mu.Unlock()
	if last {
		r.unmap()
	}
}

// close unmaps the ring, or, while views of it are out (a loop's body
// reading one while Close is called from another goroutine), leaves that
// to the last view's done.
func (r *ringReader) close() error {
	r.mu.Lock()
	r.closing = true
	now := r.views == 0 && !r.closed
	if now {
		r.closed = true
	}
	r.mu.Unlock()
	if !now {
		return nil
	}
	return r.unmap()
}

func (r *ringReader) unmap() error {
	var errs []error
	if r.table != nil {
		errs = append(errs, r.table.Close())
	}
	return errors.Join(append(errs, r.store.Close())...)
}
