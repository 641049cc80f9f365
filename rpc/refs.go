package rpc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// resolver turns references into mappings of files under a root, refusing
// any path that leaves it, and keeps the mappings open between calls.
//
// Files are opened through an os.Root, which refuses "..", absolute paths
// and symlinks that lead out of the root, at the moment of opening (no
// check-then-use race). A cached mapping is reused while the path still
// names the same file (device and inode) and the reference asks for the
// same dtype and shape; a file replaced under its name is mapped anew.
type resolver struct {
	root *os.Root
	dir  string
	max  int     // mappings kept open when unused
	fsid *fileID // the root's FSIDFile, which no reference may name

	mu    sync.Mutex
	cache map[mapKey]*mapping
}

type mapKey struct {
	path  string
	dtype memmap.DType // Invalid for a whole TensorDict
	shape string
}

// mapping is a cached open file (mm) or TensorDict (td). refs counts calls
// using it; it is closed only when no call does and it is evicted or stale.
type mapping struct {
	mm       *memmap.Tensor
	td       *tensordict.TensorDict
	key      mapKey
	id       fileID // the file mapped (a TensorDict: its meta.json), which statName must still name
	statName string // what get stats to validate the entry
	refs     int
	last     time.Time // last acquired: least recently used goes first
	stale    bool
}

func (m *mapping) close() {
	if m.mm != nil {
		m.mm.Close()
	}
	if m.td != nil {
		m.td.Close()
	}
}

func newResolver(dir string, max int) (*resolver, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("rpc: root: %w", err)
	}
	r := &resolver{root: root, dir: dir, max: max, cache: map[mapKey]*mapping{}}
	if fi, err := root.Stat(FSIDFile); err == nil {
		if id, ok := fileIDOf(fi); ok {
			r.fsid = &id
		}
	}
	return r, nil
}

// fileID identifies a file whatever names it; fileIDOf (fileid_unix.go)
// reads it from a FileInfo.
type fileID struct{ dev, ino uint64 }

// local checks that path (slash-separated) names something inside the
// root, lexically, and returns it in the OS's form.
func local(path string) (string, error) {
	name := filepath.FromSlash(path)
	if !filepath.IsLocal(name) || strings.ContainsAny(path, "\\\x00") {
		return "", Errorf(PermissionDenied, "%q is not a path inside the shared root", path)
	}
	return name, nil
}

// acquire returns the mapping ref names, opened with dtype dt, held until
// release. Paths that escape the root are PermissionDenied; a missing file
// NotFound; a file too short for the shape InvalidArgument.
func (r *resolver) acquire(ref *wireRef, dt memmap.DType) (*mapping, error) {
	name, err := local(ref.Path)
	if err != nil {
		return nil, err
	}
	if _, err := memmap.NumBytes(dt, ref.File); err != nil {
		return nil, Errorf(InvalidArgument, "reference %q: %w", ref.Path, err)
	}
	key := mapKey{path: name, dtype: dt, shape: fmt.Sprint(ref.File)}
	return r.get(key, name, func(fileID) (*mapping, error) { return r.open(name, ref, dt) })
}

// acquireTD returns the TensorDict stored at prefix under the root, loaded
// read-only, held until release. It is reloaded when its meta.json is
// replaced. Files reached through symlinks out of the root are refused.
func (r *resolver) acquireTD(prefix string) (*mapping, error) {
	name, err := local(prefix)
	if err != nil {
		return nil, err
	}
	key := mapKey{path: name}
	return r.get(key, filepath.Join(name, "meta.json"), func(id fileID) (*mapping, error) {
		m, err := r.loadTD(name, prefix)
		if m != nil {
			m.id = id // read-only: its meta.json, as stated, validates it
		}
		return m, err
	})
}

// loadTDFresh is acquireTD without the cache: the TensorDict at prefix
// opened anew, for a peer that writes through another page cache. A new
// open is what makes another client's writes visible on NFS
// (close-to-open) and FUSE; a mapping made before them may never see them.
// The mapping is closed at its release.
func (r *resolver) loadTDFresh(prefix string) (*mapping, error) {
	name, err := local(prefix)
	if err != nil {
		return nil, err
	}
	statName := filepath.Join(name, "meta.json")
	fi, err := r.root.Stat(statName)
	if err == nil && !fi.Mode().IsRegular() {
		err = &fs.PathError{Op: "stat", Path: statName, Err: errNotRegular}
	}
	if err != nil {
		return nil, r.openError(name, err)
	}
	m, err := r.loadTD(name, prefix)
	if err != nil {
		return nil, err
	}
	m.refs, m.stale = 1, true
	return m, nil
}

// get returns the cached entry for key if statName still names the same
// file, or opens a new one with open, given the id statName had. open sets
// the new entry's id: that of the file it opened, which may be another if
// the name was replaced since (open checks it again).
func (r *resolver) get(key mapKey, statName string, open func(id fileID) (*mapping, error)) (*mapping, error) {
	fi, err := r.root.Stat(statName)
	if err == nil && !fi.Mode().IsRegular() {
		// Refused before anything opens it: opening a FIFO blocks, and
		// opening a device may do anything.
		perr := &fs.PathError{Op: "stat", Path: statName, Err: errNotRegular}
		if fi.IsDir() {
			perr.Err = syscall.EISDIR
		}
		err = perr
	}
	if err != nil {
		r.mu.Lock()
		if m := r.cache[key]; m != nil {
			r.dropLocked(m) // the file is gone: free its mapping, and its disk space
		}
		r.mu.Unlock()
		return nil, r.openError(key.path, err)
	}
	id, ok := fileIDOf(fi)
	if !ok {
		return nil, Errorf(Internal, "%q: no inode", key.path)
	}
	if r.fsid != nil && *r.fsid == id {
		// Written through a reference, it would change the root's identity
		// for every node that shares it.
		return nil, Errorf(PermissionDenied, "reference %q: the shared root's identity file", key.path)
	}
	r.mu.Lock()
	if m := r.cache[key]; m != nil {
		if m.id == id {
			m.refs++
			m.last = time.Now()
			r.mu.Unlock()
			return m, nil
		}
		r.dropLocked(m) // the name now holds another file
	}
	r.mu.Unlock()

	m, err := open(id)
	if err != nil {
		return nil, err
	}
	m.key, m.statName, m.refs = key, statName, 1

	r.mu.Lock()
	defer r.mu.Unlock()
	m.last = time.Now()
	if old := r.cache[key]; old != nil {
		r.dropLocked(old)
	}
	r.cache[key] = m
	r.evictLocked()
	return m, nil
}

// loadTD loads the TensorDict at name read-only, every file of it (meta.json
// files, leaves, non-tensor data, nested folders) opened through the root:
// one reached through ".." or a symlink leading out is PermissionDenied, and
// one that is not a regular file (a FIFO, whose opening would block) is
// InvalidArgument, checked as each is opened.
func (r *resolver) loadTD(name, prefix string) (*mapping, error) {
	td, err := tensordict.LoadMemmap(filepath.Join(r.dir, name), tensordict.ReadOnly(), tensordict.InRoot(r.root))
	if err != nil {
		if escapes(err) {
			return nil, Errorf(PermissionDenied, "%q: %v", prefix, err)
		}
		return nil, Errorf(CodeOf(err), "%q: %w", prefix, err)
	}
	return &mapping{td: td}, nil
}

// escapes reports whether err is os.Root refusing a path that leads out of
// the root (".." or a symlink out, or a loop of them).
func escapes(err error) bool {
	return strings.Contains(err.Error(), "escapes") || errors.Is(err, syscall.ELOOP)
}

// open maps name read-write, or read-only when the file may not be written
// (then writes through it fail with memmap.ErrReadOnly: PermissionDenied).
// The file it opened is checked by its descriptor, since get's stat of the
// name is not the open: a name swapped between the two for a link to the
// root's FSIDFile is PermissionDenied here, as it is at the stat. The
// mapping's id is the opened file's, whatever the name held at the stat,
// so that get validates it against the file it maps.
func (r *resolver) open(name string, ref *wireRef, dt memmap.DType) (*mapping, error) {
	mode := memmap.ReadWrite
	// O_NONBLOCK: get checked the file is regular, but it may have been
	// swapped for a FIFO since, whose opening would block; OpenFile
	// refuses anything not regular.
	f, err := r.root.OpenFile(name, os.O_RDWR|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) {
		mode = memmap.ReadOnly
		f, err = r.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	}
	if err != nil {
		return nil, r.openError(ref.Path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, r.openError(ref.Path, err)
	}
	id, ok := fileIDOf(fi)
	switch {
	case !ok:
		f.Close()
		return nil, Errorf(Internal, "%q: no inode", ref.Path)
	case r.fsid != nil && *r.fsid == id:
		f.Close()
		return nil, Errorf(PermissionDenied, "reference %q: the shared root's identity file", ref.Path)
	}
	mm, err := memmap.OpenFile(f, dt, ref.File, mode)
	if err != nil {
		f.Close()
		return nil, Errorf(CodeOf(err), "reference %q: %w", ref.Path, err)
	}
	return &mapping{mm: mm, id: id}, nil
}

// errNotRegular is a referenced file that is neither a regular file nor a
// folder: a FIFO, a device, a socket.
var errNotRegular = errors.New("not a regular file")

// openError classifies an error from opening a referenced path.
func (r *resolver) openError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Errorf(NotFound, "reference %q: no such file under the shared root", path)
	case errors.Is(err, syscall.ENOTDIR):
		return Errorf(NotFound, "reference %q: no such file under the shared root (%v)", path, err)
	case errors.Is(err, syscall.EISDIR):
		return Errorf(InvalidArgument, "reference %q: a directory, not a tensor file", path)
	case errors.Is(err, errNotRegular), errors.Is(err, syscall.ENAMETOOLONG):
		return Errorf(InvalidArgument, "reference %q: %v", path, err)
	case errors.Is(err, fs.ErrPermission), escapes(err):
		return Errorf(PermissionDenied, "reference %q: %v", path, err)
	}
	return Errorf(Internal, "reference %q: %v", path, err)
}

// release ends a call's use of m.
func (r *resolver) release(m *mapping) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m.refs--
	if m.refs == 0 && m.stale {
		m.close()
	}
}

// dropLocked removes m from the cache; it is closed now or at its last
// release.
func (r *resolver) dropLocked(m *mapping) {
	if r.cache[m.key] == m {
		delete(r.cache, m.key)
	}
	m.stale = true
	if m.refs == 0 {
		m.close()
	}
}

// evictLocked closes the least recently used idle mappings beyond max.
func (r *resolver) evictLocked() {
	for len(r.cache) > r.max {
		var victim *mapping
		for _, m := range r.cache {
			if m.refs == 0 && (victim == nil || m.last.Before(victim.last)) {
				victim = m
			}
		}
		if victim == nil {
			return // all in use
		}
		r.dropLocked(victim)
	}
}

// sweep closes the idle mappings not used for idle, and those whose file
// was deleted or replaced: a node must not keep a deleted 1 GB file's disk
// space (or its page cache) for as long as it runs.
func (r *resolver) sweep(idle time.Duration) {
	r.mu.Lock()
	var check []*mapping
	for _, m := range r.cache {
		switch {
		case m.refs > 0:
		case time.Since(m.last) > idle:
			r.dropLocked(m)
		default:
			check = append(check, m)
		}
	}
	r.mu.Unlock()
	for _, m := range check {
		if fi, err := r.root.Stat(m.statName); err == nil {
			if id, ok := fileIDOf(fi); ok && id == m.id {
				continue
			}
		}
		r.mu.Lock()
		if m.refs == 0 && !m.stale {
			r.dropLocked(m)
		}
		r.mu.Unlock()
	}
}

// close unmaps everything; calls still holding mappings see ErrClosed.
func (r *resolver) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.cache {
		m.stale = true
		m.close()
	}
	clear(r.cache)
	return r.root.Close()
}
