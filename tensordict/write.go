package tensordict

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/tensorwire/tensorwire/internal/atomicfile"
	"github.com/tensorwire/tensorwire/memmap"
)

// Memmap writes td to the folder prefix in tensordict's memmap format and
// returns the written TensorDict, memory-mapped read-write (tensordict's
// td.memmap(prefix)). The caller must Close the result; td is unchanged.
//
// Leaf files are written first and flushed, then each folder's meta.json,
// atomically (temporary file, fsync, rename, fsync of the folder), nested
// folders before their parent; an existing meta.json at prefix is removed
// first. So a reader sees either the whole new TensorDict or no meta.json,
// never a meta.json that promises files still being written. Files of the
// same names are replaced; other files in prefix are left alone. Unsynced
// leaves out every flush and fsync, for SyncPrefix to do at once later.
func (td *TensorDict) Memmap(prefix string, opts ...WriteOption) (*TensorDict, error) {
	return td.writeRoot(prefix, writeOpts(true, opts))
}

// MemmapLike creates zero-filled storage at prefix with td's keys, dtypes,
// shapes and non-tensors, without reading td's data, and returns it
// memory-mapped read-write (tensordict's td.memmap_like(prefix)). The disk
// blocks are reserved up front: a dataset that does not fit is an error
// here, not a crash while filling it.
func (td *TensorDict) MemmapLike(prefix string, opts ...WriteOption) (*TensorDict, error) {
	return td.writeRoot(prefix, writeOpts(false, opts))
}

// A WriteOption changes how Memmap and MemmapLike write.
type WriteOption func(*writeOptions)

type writeOptions struct {
	copyData bool // Memmap: the data too, not zeros
	unsynced bool // Unsynced
}

func writeOpts(copyData bool, opts []WriteOption) writeOptions {
	o := writeOptions{copyData: copyData}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Unsynced has Memmap and MemmapLike make nothing durable: files are
// created (their blocks reserved), written and renamed into place in the
// same order as without it, and every process sees them at once, but no
// file is flushed and no folder synced, so a crash may lose or tear any of
// them. It is for a caller that writes more into the files and then makes
// the whole prefix durable at once with SyncPrefix: one sync a file and a
// folder, where the synced forms sync the new folder, each leaf and
// meta.json as they go, and the writer its data again after.
func Unsynced() WriteOption { return func(o *writeOptions) { o.unsynced = true } }

func (td *TensorDict) writeRoot(prefix string, o writeOptions) (*TensorDict, error) {
	if err := td.checkForDisk(nil); err != nil { // refuse before writing anything
		return nil, fmt.Errorf("memmap %s: %w", prefix, err)
	}
	top := missingTop(prefix)
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return nil, fmt.Errorf("memmap %s: %w", prefix, err)
	}
	if err := os.Remove(filepath.Join(prefix, metaFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("memmap %s: %w", prefix, err)
	}
	var maps []*memmap.Tensor
	out, err := td.writeDir(prefix, o, &maps)
	if err != nil {
		// Give the space back (a full disk is the usual cause): the files
		// written, or the whole folder if this call made it.
		closeAll(maps)
		if top != "" {
			os.RemoveAll(top)
		} else {
			for _, m := range maps {
				os.Remove(m.Path())
			}
		}
		return nil, fmt.Errorf("memmap %s: %w", prefix, err)
	}
	out.maps = maps
	return out, nil
}

// checkForDisk returns an error wrapping ErrKey for the first key of td's
// tree that cannot be written (checkKeyForDisk), or that would be written
// under the same name as another key of its TensorDict: a leaf "a"
// (a.memmap) and a folder "a.memmap", or a folder "meta.json". path is td's
// place in the tree.
func (td *TensorDict) checkForDisk(path []string) error {
	names := make(map[string]string, len(td.keys)+1)
	names[metaFile] = "" // the TensorDict's own meta.json
	for _, k := range td.keys {
		p := append(slices.Clip(path), k)
		if err := checkKeyForDisk(k); err != nil {
			return fmt.Errorf("%s: %w", keyString(p), err)
		}
		name := escapeKey(k)
		switch v := td.vals[k].(type) {
		case *Tensor:
			if v.NumBytes() == 0 {
				continue // no file, as in tensordict
			}
			name += leafSuffix
		case *TensorDict:
			if err := v.checkForDisk(p); err != nil {
				return err
			}
		}
		if other, ok := names[name]; ok {
			what := fmt.Sprintf("key %q's", other)
			if name == metaFile {
				what = "its TensorDict's"
			}
			return fmt.Errorf("%s: %w: would be written as %q, %s name", keyString(p), ErrKey, name, what)
		}
		names[name] = k
	}
	return nil
}

// missingTop returns the outermost folder of path that does not exist, the
// one MkdirAll(path) creates first, or "" if path exists.
func missingTop(path string) string {
	top := ""
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			return top
		}
		top = p
		if filepath.Dir(p) == p {
			return top
		}
	}
}

// writeDir writes td's leaves and nested folders into dir, then its
// meta.json, and returns the mapped copy; created mappings go to *maps.
func (td *TensorDict) writeDir(dir string, o writeOptions, maps *[]*memmap.Tensor) (*TensorDict, error) {
	out := newDict(td.batch)
	out.prefix = dir
	meta := newJSONObject()
	for _, k := range td.keys {
		v := td.vals[k] // keys were checked by writeRoot
		// escapeKey's name is one path component, never "." or "..": the
		// file or folder is in dir, whatever the key.
		name := filepath.Join(dir, escapeKey(k))
		var nv Value
		var err error
		switch v := v.(type) {
		case *Tensor:
			nv, err = writeLeaf(filepath.Join(dir, escapeKey(k)+leafSuffix), v, o, maps)
			if err == nil {
				err = meta.member(k, tensorMeta(v))
			}
		case *TensorDict:
			if err = os.MkdirAll(name, 0o755); err == nil {
				nv, err = v.writeDir(name, o, maps)
			}
			if err == nil {
				err = meta.member(k, map[string]string{"type": "TensorDict"})
			}
		case *NonTensor:
			nv, err = v, writeNonTensor(name, v, o)
			if err == nil {
				err = meta.member(k, map[string]string{"type": "NonTensorData"})
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%q: %w", k, err)
		}
		out.keys = append(out.keys, k)
		out.vals[k] = nv
	}
	if err := meta.member("shape", shapeJSON(td.batch)); err != nil {
		return nil, err
	}
	meta.member("device", "cpu")
	meta.member("_type", typeTensorDict)
	if err := writeMeta(filepath.Join(dir, metaFile), meta.bytes(), o); err != nil {
		return nil, err
	}
	out.locked = true
	return out, nil
}

// writeLeaf creates the file of one tensor, copies its data if asked, and
// flushes it. A tensor without elements gets no file, as in tensordict.
func writeLeaf(path string, t *Tensor, o writeOptions, maps *[]*memmap.Tensor) (*Tensor, error) {
	if t.NumBytes() == 0 {
		return Zeros(t.dtype, t.shape...)
	}
	create := memmap.Create
	if o.unsynced {
		create = memmap.CreateUnsynced
	}
	mm, err := create(path, t.dtype, t.shape...)
	if err != nil {
		return nil, err
	}
	*maps = append(*maps, mm)
	out := &Tensor{dtype: t.dtype, shape: t.Shape(), mm: mm}
	if o.copyData {
		if err := out.copyFrom(t); err != nil {
			return nil, err
		}
	}
	if o.unsynced {
		return out, nil
	}
	if err := mm.Flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// writeNonTensor writes a NonTensorData folder: a meta.json with the data,
// and the two other fields of tensordict's NonTensorData in the order
// tensordict writes them. A stale pickle from an earlier writer is removed,
// as tensordict does.
func writeNonTensor(dir string, n *NonTensor, o writeOptions) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	meta := newJSONObject()
	meta.member("_type", typeNonTensorData)
	if err := meta.member("data", n.Data); err != nil {
		return err
	}
	meta.member("_is_non_tensor", true)
	meta.member("_metadata", nil)
	if err := os.Remove(filepath.Join(dir, pickleFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return writeMeta(filepath.Join(dir, metaFile), meta.bytes(), o)
}

// writeMeta replaces a meta.json atomically, synced unless o.unsynced.
func writeMeta(path string, data []byte, o writeOptions) error {
	if o.unsynced {
		return atomicfile.WriteFileUnsynced(path, data, 0o644)
	}
	return atomicfile.WriteFile(path, data, 0o644)
}

// Flush makes every write to a memory-mapped TensorDict's files durable
// (msync and fsync of each). It does nothing for one in Go memory, or for a
// view: flush the TensorDict that Memmap or LoadMemmap returned.
func (td *TensorDict) Flush() error {
	for _, m := range td.mapped() {
		if err := m.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// Prefault maps every page of a memory-mapped TensorDict's files into this
// process's page tables now (memmap.Tensor.Prefault: by reading, no byte
// changed), so that a loop's first touch of each page does not fault. It
// does nothing for one in Go memory, or for a view: prefault the TensorDict
// that Memmap or LoadMemmap returned. Errors wrap errors.ErrUnsupported
// where the system cannot.
func (td *TensorDict) Prefault() error {
	for _, m := range td.mapped() {
		if err := m.Prefault(); err != nil {
			return err
		}
	}
	return nil
}

// Close unmaps the files of a TensorDict returned by Memmap, MemmapLike or
// LoadMemmap, after the calls in flight on them return (Flush and Prefault
// included: they may run concurrently with it). Views and tensors taken
// from it stop working (their methods return memmap.ErrClosed). It does not
// flush. Close on any other TensorDict, or a second time, does nothing.
func (td *TensorDict) Close() error {
	td.mapsMu.Lock()
	maps := td.maps
	td.maps = nil
	td.mapsMu.Unlock()
	return closeAll(maps)
}

func closeAll(maps []*memmap.Tensor) error {
	var errs []error
	for _, m := range maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}
