package store

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// A value's folder deleted under the store (by a person, a script, a
// failing disk) costs that value only: its item, or parameter version, is
// marked lost, found at Open or when a read stats it. The rest of the store
// is read as ever; reading the lost one alone fails with ErrMissing naming
// it; Options.Repair drops lost items (a get record, so the log agrees).

const (
	lostItemMsg    = "store: a value's folder is missing: its item is lost (Get and Peek return the bin's other items; Options.Repair, the node's --store NAME,repair=drop, drops it)"
	lostVersionMsg = "store: a parameter version's folder is missing: reading it fails until a newer version is published"
)

// valueGone reports whether value id's folder is missing from values/.
// Another error (a permission, say) is not taken for a loss.
func (s *Store) valueGone(id uint64) bool {
	_, err := s.root.Lstat(filepath.Join(valuesDir, fmt.Sprintf("%016x", id)))
	return errors.Is(err, fs.ErrNotExist)
}

// relValue is the path of value id relative to the store's folder, as
// errors name it.
func relValue(id uint64) string { return filepath.Join(valuesDir, fmt.Sprintf("%016x", id)) }

// markMissing stats the prefixes of bin's items not known lost (outside
// s.mu) and marks those missing lost.
func (s *Store) markMissing(bin string) {
	s.mu.Lock()
	var ids []uint64
	if b := s.bins[bin]; b != nil {
		for _, it := range b.items {
			if it.inline == nil && !it.lost {
				ids = append(ids, it.id)
			}
		}
	}
	s.mu.Unlock()
	gone := map[uint64]bool{}
	for _, id := range ids {
		if s.valueGone(id) {
			gone[id] = true
		}
	}
	if len(gone) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Items removed meanwhile had their folder deleted with them: only
	// those still in the bin are lost.
	if b := s.bins[bin]; b != nil {
		for _, it := range b.items {
			if gone[it.id] && !it.lost {
				it.lost = true
				if it.take != 0 {
					s.dropTakeLocked(it.take)
				}
				s.opts.Logger.Error(lostItemMsg, "bin", bin, "path", s.valuePath(it.id))
			}
		}
	}
}

// missingItems is ErrMissing for the lost items of bin.
func missingItems(bin string, lost []*item) error {
	var paths []string
	for _, it := range lost[:min(len(lost), 3)] {
		paths = append(paths, relValue(it.id))
	}
	more := ""
	if len(lost) > 3 {
		more = fmt.Sprintf(" and %d more", len(lost)-3)
	}
	return errorf(ErrMissing, "bin %q holds only items whose folders are missing (%s%s): they are lost; "+
		"Delete the bin, or reopen the store with Options.Repair (the node's --store NAME,repair=drop) to drop them",
		bin, strings.Join(paths, ", "), more)
}

// dropLost removes the lost items from their bins, durably, each with a
// get record (an OpGet event), and says what it dropped. Open calls it
// with Options.Repair.
func (s *Store) dropLost() error {
	s.mu.Lock()
	var names []string
	for name, b := range s.bins {
		for _, it := range b.items {
			if it.lost {
				names = append(names, name)
				break
			}
		}
	}
	s.mu.Unlock()
	for _, name := range names {
		s.mu.Lock()
		rec := &record{Op: recGet, Name: name}
		for _, it := range s.bins[name].items {
			if it.lost {
				rec.IDs = append(rec.IDs, it.id)
			}
		}
		p, err := prepare(rec)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		s.rev++
		rec.Rev = s.rev
		s.commitLocked(rec, p)
		s.mu.Unlock()
		if err := s.log.wait(rec.Rev); err != nil {
			return err
		}
		for _, id := range rec.IDs {
			s.opts.Logger.Warn("store repair: dropped an item whose folder is missing", "bin", name, "path", s.valuePath(id))
		}
	}
	return nil
}
