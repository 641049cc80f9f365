package tensordict

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/tensorwire/tensorwire/memmap"
)

// LoadOption changes how LoadMemmap maps a TensorDict.
type LoadOption func(*loadOptions)

type loadOptions struct {
	mode  memmap.Mode
	depth int      // nesting level of the folder being loaded
	root  *os.Root // InRoot's: every file is opened through it
	base  string   // the absolute folder root names, when root is set
	read  *folders // the folders this load has read, shared by every level
}

// maxDepth bounds the nesting of TensorDicts LoadMemmap follows.
const maxDepth = 64

// folders is the set of folders one LoadMemmap has read, by identity
// (device and inode on Unix, os.SameFile elsewhere), so that it reads none
// twice: a folder reached again, through symlinks from two keys to one
// folder or a symlink loop, would be loaded again with all below it, and
// a few such folders nested would multiply into more loads than any
// dataset holds.
type folders struct {
	ids   map[fileID]bool
	infos []fs.FileInfo // where idOf gives no fileID
}

// add records folder fi and reports whether it was not yet there.
func (s *folders) add(fi fs.FileInfo) bool {
	if id, ok := idOf(fi); ok {
		if s.ids[id] {
			return false
		}
		if s.ids == nil {
			s.ids = map[fileID]bool{}
		}
		s.ids[id] = true
		return true
	}
	for _, old := range s.infos {
		if os.SameFile(old, fi) {
			return false
		}
	}
	s.infos = append(s.infos, fi)
	return true
}

// ReadOnly maps the files read-only (copy-on-write): writes through the
// TensorDict's methods fail with memmap.ErrReadOnly, and the files cannot
// change under any circumstance.
func ReadOnly() LoadOption { return func(o *loadOptions) { o.mode = memmap.ReadOnly } }

// InRoot opens every file LoadMemmap reads through root (os.Root), for a
// TensorDict named by someone who must not reach outside it, such as a
// remote peer: prefix must lie under root's folder, and a meta.json, leaf
// or folder reached through ".." or a symlink leading out of root is an
// error (os.Root's "path escapes from parent"), as is a file that is not a
// regular file (a FIFO would block, a device could do anything), which
// wraps ErrFormat. The check is made as each file is opened, so a symlink
// swapped in meanwhile cannot slip through.
func InRoot(root *os.Root) LoadOption {
	return func(o *loadOptions) {
		o.root = root
		o.base, _ = filepath.Abs(root.Name())
	}
}

// errNotRegular is a file that InRoot refuses to open: not a regular file.
var errNotRegular = errors.New("not a regular file")

// rel returns path relative to the root's folder, for os.Root's methods.
func (o *loadOptions) rel(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	r, err := filepath.Rel(o.base, abs)
	if err != nil || !filepath.IsLocal(r) && r != "." {
		return "", &fs.PathError{Op: "open", Path: path, Err: errors.New("path escapes from parent")}
	}
	return r, nil
}

// open opens the regular file at path for reading, or for writing too if
// write, through the root when there is one. It never blocks on a FIFO.
func (o *loadOptions) open(path string, write bool) (*os.File, error) {
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR
	}
	if o.root == nil {
		return os.OpenFile(path, flag, 0)
	}
	r, err := o.rel(path)
	if err != nil {
		return nil, err
	}
	f, err := o.root.OpenFile(r, flag|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = &fs.PathError{Op: "open", Path: path, Err: errNotRegular}
		}
		return nil, err
	}
	return f, nil
}

// stat is os.Stat, through the root when there is one.
func (o *loadOptions) stat(path string) (fs.FileInfo, error) {
	if o.root == nil {
		return os.Stat(path)
	}
	r, err := o.rel(path)
	if err != nil {
		return nil, err
	}
	return o.root.Stat(r)
}

// lstat is os.Lstat, through the root when there is one.
func (o *loadOptions) lstat(path string) (fs.FileInfo, error) {
	if o.root == nil {
		return os.Lstat(path)
	}
	r, err := o.rel(path)
	if err != nil {
		return nil, err
	}
	return o.root.Lstat(r)
}

// LoadMemmap maps the TensorDict stored at prefix, written by Memmap or by
// tensordict's memmap in Python, read-write unless ReadOnly is given
// (tensordict's TensorDict.load_memmap(prefix)). The caller must Close it.
//
// Keys keep meta.json's order. A missing or corrupt meta.json (one that
// names a member twice included), an unknown dtype, a missing or short leaf
// file, or a tensor whose shape does not fit the batch size is an error
// wrapping ErrFormat that names the file; pickled non-tensors, nested
// (jagged) tensors and lazy stacks wrap ErrUnsupported. A folder reached a
// second time in one load (two keys linked to one folder, a symlink loop)
// wraps ErrFormat too: a load reads each folder once, so its work grows
// with what is on disk, never faster.
func LoadMemmap(prefix string, opts ...LoadOption) (*TensorDict, error) {
	o := loadOptions{mode: memmap.ReadWrite, read: &folders{}}
	for _, opt := range opts {
		opt(&o)
	}
	if o.root != nil {
		abs, err := filepath.Abs(prefix)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", prefix, err)
		}
		prefix = abs
	}
	var maps []*memmap.Tensor
	td, err := loadDir(prefix, o, &maps)
	if err != nil {
		closeAll(maps)
		return nil, fmt.Errorf("load %s: %w", prefix, err)
	}
	td.maps = maps
	return td, nil
}

// readMeta reads and parses a folder's meta.json, and its _type. A folder
// this load has read already is an error wrapping ErrFormat.
func (o *loadOptions) readMeta(dir string) ([]member, string, error) {
	path := filepath.Join(dir, metaFile)
	var data []byte
	f, err := o.open(path, false)
	if err == nil {
		data, err = io.ReadAll(f)
		f.Close()
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("%w: %s is missing (not a memory-mapped TensorDict, or one still being written)", ErrFormat, path)
		}
		return nil, "", fmt.Errorf("%w: %w", ErrFormat, err)
	}
	fi, err := o.stat(dir)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrFormat, err)
	}
	if !o.read.add(fi) {
		return nil, "", fmt.Errorf("%w: %s: folder loaded already in this TensorDict (two keys linked to one folder, or a symlink loop)", ErrFormat, dir)
	}
	members, err := parseObject(data)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %s: %w", ErrFormat, path, err)
	}
	var typ string
	for _, m := range members {
		if m.key == "_type" {
			if err := json.Unmarshal(m.val, &typ); err != nil {
				return nil, "", fmt.Errorf("%w: %s: _type: %w", ErrFormat, path, err)
			}
		}
	}
	return members, typ, nil
}

func loadDir(dir string, o loadOptions, maps *[]*memmap.Tensor) (*TensorDict, error) {
	members, typ, err := o.readMeta(dir)
	if err != nil {
		return nil, err
	}
	return dictFrom(dir, members, typ, o, maps)
}

// dictFrom builds the TensorDict of folder dir from its meta.json, already
// read: members and _type typ.
func dictFrom(dir string, members []member, typ string, o loadOptions, maps *[]*memmap.Tensor) (*TensorDict, error) {
	metaPath := filepath.Join(dir, metaFile)
	if typ != typeTensorDict && typ != typeTensorDictOld {
		return nil, fmt.Errorf("%w: %s holds a %s, not a TensorDict", ErrUnsupported, metaPath, typ)
	}
	batch := []int{}
	for _, m := range members {
		if m.key == "shape" {
			if err := json.Unmarshal(m.val, &batch); err != nil {
				return nil, fmt.Errorf("%w: %s: batch size: %w", ErrFormat, metaPath, err)
			}
		}
	}
	if _, err := memmap.NumElements(batch); err != nil {
		return nil, fmt.Errorf("%w: %s: batch size: %w", ErrFormat, metaPath, err)
	}
	td := newDict(batch)
	td.prefix = dir
	for _, m := range members {
		if reservedKeys[m.key] || !bytes.HasPrefix(bytes.TrimSpace(m.val), []byte{'{'}) {
			continue // the TensorDict's own fields, or other metadata tensordict also skips
		}
		var e entry
		if err := json.Unmarshal(m.val, &e); err != nil {
			return nil, fmt.Errorf("%w: %s: entry %q: %w", ErrFormat, metaPath, m.key, err)
		}
		var v Value
		var err error
		switch {
		case e.Type != nil:
			v, err = loadCollection(dir, m.key, o, maps)
		case e.DType != "":
			v, err = loadLeaf(dir, m.key, e.leafEntry, o, maps)
		default:
			err = fmt.Errorf("%w: %s: entry %q is neither a tensor nor a collection", ErrFormat, metaPath, m.key)
		}
		if err != nil {
			return nil, err
		}
		if err := td.Set(m.key, v); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrFormat, metaPath, err)
		}
	}
	td.locked = true
	return td, nil
}

// findName returns the path of a key's file (suffix leafSuffix) or folder
// (suffix "") in dir, as tensordict 0.14 looks for it: the escaped name
// first, then the name an older writer used (legacyName). Either is inside
// dir.
func (o *loadOptions) findName(dir, key, suffix string) (string, error) {
	p := filepath.Join(dir, escapeKey(key)+suffix)
	_, err := o.lstat(p)
	if legacy, ok := legacyName(key, suffix); ok && errors.Is(err, fs.ErrNotExist) {
		raw := filepath.Join(dir, legacy)
		if _, rerr := o.lstat(raw); rerr == nil {
			return raw, nil
		}
	}
	return p, err
}

func loadLeaf(dir, key string, e leafEntry, o loadOptions, maps *[]*memmap.Tensor) (*Tensor, error) {
	metaPath := filepath.Join(dir, metaFile)
	if e.IsNested {
		return nil, fmt.Errorf("%w: %s: %q is a nested (jagged) tensor", ErrUnsupported, metaPath, key)
	}
	dt, shape, err := parseLeaf(e)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %q: %w", ErrFormat, metaPath, key, err)
	}
	path, err := o.findName(dir, key, leafSuffix)
	if n, _ := memmap.NumBytes(dt, shape); n == 0 {
		return Zeros(dt, shape...) // tensordict writes no file for these
	}
	if err != nil {
		return nil, fmt.Errorf("%w: leaf %q: %w", ErrFormat, key, err)
	}
	f, err := o.open(path, o.mode == memmap.ReadWrite)
	if err != nil {
		return nil, fmt.Errorf("%w: leaf %q: %w", ErrFormat, key, err)
	}
	mm, err := memmap.OpenFile(f, dt, shape, o.mode)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: leaf %q: %w", ErrFormat, key, err)
	}
	*maps = append(*maps, mm)
	return &Tensor{dtype: dt, shape: shape, mm: mm}, nil
}

func loadCollection(dir, key string, o loadOptions, maps *[]*memmap.Tensor) (Value, error) {
	if o.depth++; o.depth > maxDepth {
		return nil, fmt.Errorf("%w: %s: TensorDicts nested more than %d deep", ErrFormat, dir, maxDepth)
	}
	sub, err := o.findName(dir, key, "")
	if err != nil {
		return nil, fmt.Errorf("%w: folder of %q: %w", ErrFormat, key, err)
	}
	members, typ, err := o.readMeta(sub)
	if err != nil {
		return nil, err
	}
	if typ == typeNonTensorData {
		return o.nonTensorFrom(sub, members)
	}
	return dictFrom(sub, members, typ, o, maps)
}

// nonTensorFrom builds the NonTensor of folder dir from its meta.json's
// members, already read, unless the folder holds pickled data.
func (o *loadOptions) nonTensorFrom(dir string, members []member) (*NonTensor, error) {
	if _, err := o.lstat(filepath.Join(dir, pickleFile)); err == nil {
		return nil, fmt.Errorf("%w: %s: pickled non-tensor data is never loaded (it can run code); store JSON-able data instead",
			ErrUnsupported, filepath.Join(dir, pickleFile))
	}
	for _, m := range members {
		if m.key != "data" {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(m.val))
		dec.UseNumber() // integers beyond 2^53 survive a round trip
		var n NonTensor
		if err := dec.Decode(&n.Data); err != nil {
			return nil, fmt.Errorf("%w: %s: data: %w", ErrFormat, filepath.Join(dir, metaFile), err)
		}
		return &n, nil
	}
	return nil, fmt.Errorf("%w: %s has no data", ErrFormat, filepath.Join(dir, metaFile))
}
