package store

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A store's folder (docs/store.md, "Files"):
//
//	LOCK          held (flock) by the process serving the store
//	store.log     the log
//	values/<id>/  values kept as prefixes: tensordict memmap folders,
//	              written once and never changed; <id> is 16 hex digits
//	staging/      prefixes being written: by clients sending values by
//	              reference (32 hex digits), by the node ("n-" and an id)
//	trash/        prefixes being deleted
const (
	lockName    = "LOCK"
	logName     = "store.log"
	valuesDir   = "values"
	stagingDir  = "staging"
	trashDir    = "trash"
	stagedChars = 32 // a client's staged prefix: 32 lowercase hex digits
)

// StagingTTL is how long a prefix may sit in the staging folder before the
// node deletes it as abandoned (a client died while writing it).
const StagingTTL = time.Hour

func (s *Store) valuePath(id uint64) string {
	return filepath.Join(s.dir, valuesDir, fmt.Sprintf("%016x", id))
}

// parseValueName returns the id a values/ entry is named by.
func parseValueName(name string) (uint64, bool) {
	if len(name) != 16 {
		return 0, false
	}
	id, err := strconv.ParseUint(name, 16, 64)
	return id, err == nil
}

// newStagedName returns a fresh name for a client's staged prefix.
func newStagedName() string {
	var b [stagedChars / 2]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// validStagedName reports whether name is a client's staged prefix name.
func validStagedName(name string) bool {
	if len(name) != stagedChars {
		return false
	}
	for _, c := range []byte(name) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// writePrefix writes td as a tensordict memmap folder at dir, durably
// unless noSync: MemmapLike lays out the files and meta.json (blocks
// reserved) without syncing any, each tensor's bytes are written with
// pwrite, which costs no page faults, their writeback started as they go,
// and then the whole folder is synced at once (tensordict.SyncPrefix: each
// file, then the folders): for one leaf, three syncs, where laying it out
// synced took five and an msync (the new folder, the leaf, meta.json, the
// folder again, then the data). The folder is meant to be renamed into
// place afterwards: until then a crash may leave it torn.
func writePrefix(td *tensordict.TensorDict, dir string, noSync bool) error {
	out, err := td.MemmapLike(dir, tensordict.Unsynced())
	if err != nil {
		return err
	}
	var dst []*tensordict.Tensor // out's leaves, in the order td's are visited
	for _, t := range out.Leaves() {
		dst = append(dst, t)
	}
	i := 0
	var buf []byte
	for _, t := range td.Leaves() {
		if i >= len(dst) {
			out.Close()
			return fmt.Errorf("store: %s: fewer tensors laid out than written", dir)
		}
		if err := writeLeaf(dst[i], t, &buf, noSync); err != nil {
			out.Close()
			return err
		}
		i++
	}
	if err := out.Close(); err != nil {
		return err
	}
	if noSync {
		return nil
	}
	if err := tensordict.SyncPrefix(dir); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// writebackChunk is how many bytes of a prefix's file writeLeaf writes
// before it asks the kernel to start writing them to the disk
// (memmap.Tensor.StartWriteback): the disk works on one chunk while the
// next is copied, and the final sync waits for the last ones only (10 MB
// written and synced: p50 6.0 ms instead of 9.8 on the benchmark machine,
// less clear when its disk is congested; docs/benchmarks.md, 2026-11-29).
const writebackChunk = 1 << 20

// writeLeaf writes src's bytes into dst, a leaf MemmapLike laid out for
// it (WriteAt: pwrite for pages not in the cache, so no page faults), in
// chunks of writebackChunk whose writeback starts as each is written
// unless noSync; the sync that makes them durable is writePrefix's. A
// tensor without bytes has no file and nothing to write.
func writeLeaf(dst, src *tensordict.Tensor, buf *[]byte, noSync bool) error {
	n := src.NumBytes()
	if n == 0 {
		return nil
	}
	mm, base := dst.Mapping()
	var b []byte // src's bytes in Go memory, or nil for a mapped one
	if !src.Mapped() {
		var err error
		if b, err = src.Bytes(); err != nil {
			return fmt.Errorf("store: writing %s: %w", dst.Path(), err)
		}
	} else if cap(*buf) < writebackChunk {
		*buf = make([]byte, writebackChunk)
	}
	for off := 0; off < n; {
		var c []byte
		if b != nil {
			c = b[off:min(off+writebackChunk, n)]
		} else {
			c = (*buf)[:min(writebackChunk, n-off)]
			if _, err := src.ReadAt(c, int64(off)); err != nil {
				return fmt.Errorf("store: reading a tensor for %s: %w", dst.Path(), err)
			}
		}
		if _, err := dst.WriteAt(c, int64(off)); err != nil {
			return fmt.Errorf("store: writing %s: %w", dst.Path(), err)
		}
		off += len(c)
		if !noSync && off < n && mm != nil { // the last chunk goes with writePrefix's sync
			mm.StartWriteback(base+int64(off-len(c)), int64(len(c)))
		}
	}
	return nil
}

// publishPrefix renames the prefix at from to values/<id> and makes the
// rename durable.
func (s *Store) publishPrefix(from string, id uint64) error {
	to := s.valuePath(id)
	rel, err := filepath.Rel(s.dir, from)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := s.health(); err != nil {
		return err
	}
	if err := s.root.Rename(rel, filepath.Join(valuesDir, filepath.Base(to))); err != nil {
		return s.closedErr(fmt.Errorf("store: %w", err))
	}
	if s.opts.NoSync {
		return nil
	}
	if err := atomicfile.SyncDir(filepath.Dir(to)); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(from))
}

// removeValue deletes the prefix of value id at once: renamed into trash/
// first, so that a crash in the middle never leaves half a prefix under
// values/. For values nobody can have read: never logged (discard), or no
// record names them (Options.Repair).
func (s *Store) removeValue(id uint64) {
	s.unmap(id)
	name := fmt.Sprintf("%016x", id)
	t := filepath.Join(trashDir, name)
	if err := s.root.Rename(filepath.Join(valuesDir, name), t); err != nil {
		return // gone already, or Open's sweep will find it
	}
	s.root.RemoveAll(t)
}

// trashed is a deleted value's folder in trash/, and when it went there.
type trashed struct {
	name string
	at   time.Time
}

// trashValue deletes the prefix of value id, which readers may map: it is
// renamed into trash/<id>-<unix ms> now (values/ never holds half a
// prefix), and unlinked by the sweep once Options.TrashGrace has passed
// (after a restart too: the time is in the name).
func (s *Store) trashValue(id uint64) {
	s.unmap(id)
	now := time.Now()
	name := fmt.Sprintf("%016x-%d", id, now.UnixMilli())
	if err := s.root.Rename(relValue(id), filepath.Join(trashDir, name)); err != nil {
		return // gone already
	}
	s.mu.Lock()
	s.trash = append(s.trash, trashed{name, now})
	s.mu.Unlock()
}

// parseTrashName returns when a trash/ entry went there: ok for names
// trashValue makes; old for a bare value name (removeValue's, cut short).
func parseTrashName(name string) (at time.Time, ok, old bool) {
	if _, ok := parseValueName(name); ok {
		return time.Time{}, false, true
	}
	id, ms, found := strings.Cut(name, "-")
	if !found {
		return time.Time{}, false, false
	}
	if _, ok := parseValueName(id); !ok {
		return time.Time{}, false, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != ms {
		return time.Time{}, false, false
	}
	return time.UnixMilli(n), true, false
}

// scanTrash, at Open, takes up the deleted values in trash/: each is
// unlinked once its grace has passed (the next sweep); what a deletion cut
// short left there goes now; anything not named by the store is left
// alone.
func (s *Store) scanTrash() {
	ents, err := fs.ReadDir(s.root.FS(), trashDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		at, ok, old := parseTrashName(e.Name())
		switch {
		case old:
			s.root.RemoveAll(filepath.Join(trashDir, e.Name()))
		case ok:
			s.trash = append(s.trash, trashed{e.Name(), at})
		}
	}
	s.sweepTrash(time.Now())
}

// sweepTrash unlinks the deleted values whose grace has passed.
func (s *Store) sweepTrash(now time.Time) {
	s.mu.Lock()
	var due []string
	keep := s.trash[:0]
	for _, t := range s.trash {
		if now.Sub(t.at) >= s.opts.TrashGrace {
			due = append(due, t.name)
		} else {
			keep = append(keep, t)
		}
	}
	s.trash = keep
	s.mu.Unlock()
	for _, name := range due {
		s.root.RemoveAll(filepath.Join(trashDir, name))
	}
}

// ingest is a value about to be stored: inline, or a prefix already at
// values/<item.ID>, which discard removes if the value is not stored
// after all.
type ingest struct {
	item   recItem
	prefix bool
}

func (s *Store) discard(in *ingest) {
	if in != nil && in.prefix {
		s.removeValue(in.item.ID)
	}
}

// discardAll discards ins.
func (s *Store) discardAll(ins []*ingest) {
	for _, in := range ins {
		s.discard(in)
	}
}

// ingestAll ingests n values, the i-th by one(i), in order; on the
// first error it discards those ingested and returns it.
func (s *Store) ingestAll(n int, one func(i int) (*ingest, error)) ([]*ingest, error) {
	ins := make([]*ingest, 0, n)
	for i := range n {
		in, err := one(i)
		if err != nil {
			s.discardAll(ins)
			return nil, err
		}
		ins = append(ins, in)
	}
	return ins, nil
}

// checkSize refuses a value of size tensor bytes over
// Options.MaxValueBytes (ErrTooLarge).
func (s *Store) checkSize(size int64) error {
	if size > s.opts.MaxValueBytes {
		return errorf(ErrTooLarge, "a value of %d bytes; this store takes at most %d", size, s.opts.MaxValueBytes)
	}
	return nil
}

// ingestTD makes td a value of the store: inline when it is smaller than
// Options.InlineBytes and asPrefix is false, else written into a prefix
// under values/.
func (s *Store) ingestTD(td *tensordict.TensorDict, asPrefix bool) (*ingest, error) {
	if td == nil {
		return nil, errorf(ErrFormat, "no TensorDict")
	}
	size := valueBytes(td)
	if err := s.checkSize(size); err != nil {
		return nil, err
	}
	id := s.nextID.Add(1)
	if !asPrefix && size < s.opts.InlineBytes {
		b, err := encodeValue(td)
		if err != nil {
			return nil, err
		}
		return &ingest{item: recItem{ID: id, Size: size, Inline: b}}, nil
	}
	if err := s.health(); err != nil { // staging/ must still be the store's before writing into it
		return nil, err
	}
	tmp := s.nodeStaged(id)
	if err := writePrefix(td, tmp, s.opts.NoSync); err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, tensordict.ErrKey) {
			return nil, errorf(ErrFormat, "%v", err)
		}
		return nil, fmt.Errorf("store: writing a value: %w", err)
	}
	if err := s.publishPrefix(tmp, id); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	return &ingest{item: recItem{ID: id, Size: size}, prefix: true}, nil
}

// ingestStaged takes the prefix a client wrote at rel (relative to the
// store's folder: "staging/" and a staged name) as a value: it checks that
// it is a TensorDict within the limit and renames it under values/. A
// prefix refused is left where it is, for its writer to remove.
func (s *Store) ingestStaged(rel string) (*ingest, error) {
	name, ok := strings.CutPrefix(rel, stagingDir+"/")
	if !ok || !validStagedName(name) {
		return nil, errorf(ErrNotStaged, "%q is not %s/ and %d hex digits", rel, stagingDir, stagedChars)
	}
	dir := filepath.Join(s.dir, stagingDir, name)
	fi, err := os.Lstat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errorf(ErrNotStaged, "no prefix %s in the store's folder", rel)
		}
		return nil, fmt.Errorf("store: %w", err)
	}
	if !fi.IsDir() {
		return nil, errorf(ErrNotStaged, "%s is not a folder", rel)
	}
	td, err := tensordict.LoadMemmap(dir, tensordict.InRoot(s.root), tensordict.ReadOnly())
	if err != nil {
		return nil, errorf(ErrFormat, "the staged prefix %s: %v", rel, err)
	}
	size := valueBytes(td)
	td.Close()
	if err := s.checkSize(size); err != nil {
		return nil, err
	}
	if testBeforeTakeStaged != nil {
		testBeforeTakeStaged(dir)
	}
	id := s.nextID.Add(1)
	if err := s.publishPrefix(dir, id); err != nil {
		if errors.Is(err, fs.ErrNotExist) && s.health() == nil {
			// Its client gave up on the call and claimed it back
			// (Client's discardStaged) after the check above.
			return nil, errorf(ErrNotStaged, "the staged prefix %s went away before the node took it", rel)
		}
		return nil, err
	}
	return &ingest{item: recItem{ID: id, Size: size}, prefix: true}, nil
}

// testBeforeTakeStaged, when set by a test, runs between ingestStaged's
// check of a staged prefix and its rename.
var testBeforeTakeStaged func(dir string)

// sweepStaging removes staged prefixes older than ttl, and the node's own
// unfinished ones (all of them when ttl is 0, at Open).
func (s *Store) sweepStaging(ttl time.Duration) {
	ents, err := fs.ReadDir(s.root.FS(), stagingDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		id, node := strings.CutPrefix(e.Name(), "n-")
		if node {
			_, node = parseValueName(id)
		}
		if !node && !validStagedName(e.Name()) {
			continue // not ours: leave it
		}
		if ttl > 0 || !node {
			fi, err := e.Info()
			if err != nil || time.Since(fi.ModTime()) < max(ttl, StagingTTL) {
				continue
			}
		}
		s.root.RemoveAll(filepath.Join(stagingDir, e.Name()))
	}
}
