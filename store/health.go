package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The store's files may be removed under it: store.log deleted or
// replaced, the whole folder deleted or moved, values/ replaced by a link.
// A store that went on would acknowledge operations no restart can find.
// So the store checks, as replay's buffers do (replay/health.go):
//   - store.log and LOCK after every sync of the log (or write, with
//     NoSync), before it acknowledges what the sync covered: two stats;
//   - its folders (values/, staging/, trash/) before it renames a value
//     into values/, and every sweep (at most a second apart).
//
// A loss stops the log for good (ErrLost, logged once at ERROR): every call
// fails with it until a person decides what to do and reopens the store.

// folderIDs are the identities of the store's folders, taken at Open.
type folderIDs map[string]fs.FileInfo

func statFolders(root *os.Root) (folderIDs, error) {
	ids := folderIDs{}
	for _, name := range []string{valuesDir, stagingDir, trashDir} {
		fi, err := root.Lstat(name)
		if err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
		ids[name] = fi
	}
	return ids, nil
}

// checkLog returns why the log file f is no longer the store's log, or
// nil: store.log is another file or gone, or LOCK is (the folder was
// deleted or moved).
func (s *Store) checkLog(f *os.File) error {
	path := filepath.Join(s.dir, logName)
	fi, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s was deleted or moved; the store acknowledges nothing more", ErrLost, path)
		}
		return fmt.Errorf("%w: %s: %v", ErrLost, path, err)
	}
	if ffi, err := f.Stat(); err != nil || !os.SameFile(fi, ffi) {
		return fmt.Errorf("%w: %s was replaced by another file; the store acknowledges nothing more", ErrLost, path)
	}
	if err := s.lk.Check(); err != nil {
		return fmt.Errorf("%w: %s: the store's folder was deleted or moved (%v); the store acknowledges nothing more",
			ErrLost, path, err)
	}
	return nil
}

// checkFolders returns why one of the store's folders is no longer the
// one Open found, or nil.
func (s *Store) checkFolders() error {
	for name, was := range s.folders {
		p := filepath.Join(s.dir, name)
		fi, err := os.Lstat(p)
		if err == nil && !os.SameFile(fi, was) {
			err = errors.New("replaced by another file or a link")
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %v; the store writes and acknowledges nothing more", ErrLost, p, err)
		}
	}
	return nil
}

// health checks the log and the folders, and stops the store if they are
// lost; it returns the store's error.
func (s *Store) health() error {
	if err := s.closedErr(nil); err != nil {
		return err // its files are closed: nothing to check
	}
	if err := s.log.failed(); err != nil {
		return err
	}
	err := s.checkFolders()
	for err == nil {
		s.log.mu.Lock()
		f := s.log.f
		s.log.mu.Unlock()
		if err = s.checkLog(f); err == nil {
			break
		}
		// A compaction may have switched files meanwhile: check the
		// current one before calling it a loss.
		s.log.mu.Lock()
		switched := s.log.f != f
		s.log.mu.Unlock()
		if !switched {
			break
		}
		err = nil
	}
	if err != nil {
		if cerr := s.closedErr(nil); cerr != nil {
			return cerr // closed meanwhile: the files checked were closed, not lost
		}
		s.log.fail(err)
		s.advance(0) // wake watchers: the store has failed
		return s.log.failed()
	}
	return nil
}

// closedErr returns ErrClosed once the store is closed, and err otherwise:
// an operation that raced Close fails as closed, not with what the closed
// files said.
func (s *Store) closedErr(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return err
}
