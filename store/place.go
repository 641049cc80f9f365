package store

import (
	"fmt"
	"path/filepath"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Values sent as bytes, written into the node's staging folder as they
// arrive (rpc.PlaceBytes). A value the store keeps as a prefix (every
// published version; a value of Options.InlineBytes or more put, appended
// or in an Extend) was received whole into memory and only then written
// and synced. Now the
// node lays it out in staging/n-<id> before its body is read, its bytes go
// into the files a megabyte at a time with their writeback started, and
// the handler syncs the prefix and renames it under values/, as it does a
// prefix it wrote itself. The record, the order of syncs and renames, and
// what a crash leaves (an n- folder that Open sweeps) are those of
// ingestTD; the wire is unchanged.

// nodeStaged returns the staging folder of the value id the node writes
// itself.
func (s *Store) nodeStaged(id uint64) string {
	return filepath.Join(s.dir, stagingDir, fmt.Sprintf("n-%016x", id))
}

// placeValue is rpc.PlaceBytes's function for the value v of a request to
// the store named store: it places td when td is v's bytes and the store
// would keep them as a prefix (asPrefix: a published version), and records
// the value's id in v for ingestMsg. A value over Options.MaxValueBytes is
// refused before its bytes are read. Whatever else the handler refuses (no
// such store, a store whose folder is unwell) is left to it, with the
// value built in memory as before.
func (svc *Service) placeValue(store string, v *valueMsg, asPrefix bool, td *rpc.TD, l rpc.Layout) (rpc.Placement, error) {
	if td != v.TD {
		return rpc.Placement{}, nil
	}
	e, err := svc.stores.Lookup(store)
	if err != nil {
		return rpc.Placement{}, nil
	}
	s := e.Item
	size := l.Bytes()
	if err := s.checkSize(size); err != nil {
		return rpc.Placement{}, err
	}
	if !asPrefix && size < s.opts.InlineBytes {
		return rpc.Placement{}, nil
	}
	if s.health() != nil {
		return rpc.Placement{}, nil
	}
	id := s.nextID.Add(1)
	v.placed = id
	return rpc.Placement{Prefix: s.nodeStaged(id), Writeback: !s.opts.NoSync}, nil
}

// ingestPlaced takes the value placed in the node's staging folder as
// value id (placeValue): it syncs the prefix unless Options.NoSync and
// renames it under values/. A prefix refused is left where it is, for the
// rpc layer to remove as the call ends.
func (s *Store) ingestPlaced(td *tensordict.TensorDict, id uint64) (*ingest, error) {
	size := valueBytes(td)
	if err := s.checkSize(size); err != nil {
		return nil, err
	}
	dir := td.Prefix()
	if testIngestPlaced != nil {
		testIngestPlaced(dir)
	}
	if !s.opts.NoSync {
		if err := tensordict.SyncPrefix(dir); err != nil {
			return nil, fmt.Errorf("store: writing a value: %w", err)
		}
	}
	if err := s.publishPrefix(dir, id); err != nil {
		return nil, err
	}
	return &ingest{item: recItem{ID: id, Size: size}, prefix: true}, nil
}

// testIngestPlaced, when set by a test, is told of each placed value
// ingestPlaced takes.
var testIngestPlaced func(dir string)
