// Package lockfile makes one process the owner of something on disk (a
// replay buffer's folder, and later a store or a loader's ring) through a
// lock file: an exclusive advisory lock on a file beside what it guards
// (flock on Unix, LockFileEx on Windows), taken without waiting.
//
// The kernel drops the lock when the process that holds it dies, however
// it dies: a kill -9, a crash or an out-of-memory kill never leaves a stale
// lock behind, and nothing has to be cleaned up before the next owner
// takes it. The file itself stays (removing a lock file races with the
// next owner opening it); what it holds is only informative: the pid,
// host and program of the process that holds the lock, which a second
// process is told when it finds the lock held (HeldError). Release clears
// it; a holder that died without Release leaves it, and the next holder
// clears it as soon as it has the lock, before writing its own.
//
// Locks work between processes on one machine, in any mount or network
// namespace. On a local filesystem the lock is per open file, not per
// process: a second Acquire of the same path in the process that holds it
// fails too, as it would in another process. On a network filesystem the
// lock holds between machines only where its locking reaches the server
// (Linux NFS clients emulate flock with whole-file byte-range locks on the
// server, unless mounted with local_lock); there, what a second Acquire in
// the process holding the lock gets is not promised.
package lockfile

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrLocked is matched (errors.Is) by the error Acquire returns when
// another owner holds the lock; the error is a *HeldError naming it.
var ErrLocked = errors.New("lockfile: held by another process")

// ErrLost is matched by Check's error once the lock file at the lock's path
// is no longer the file that was locked: it, or a folder above it, was
// deleted, renamed or replaced. Whatever the lock guarded may then have
// been deleted with it, or be owned by another process that took a lock on
// the new file.
var ErrLost = errors.New("lockfile: lost")

// errWouldBlock is what the platform's lock call returns, wrapped or bare,
// when another open file holds the lock.
var errWouldBlock = errors.New("lock held")

// HeldError is the error of an Acquire that found the lock held: the path
// and what the holder wrote into the file when it took the lock. PID is 0
// and Host "" when the holder had not written them yet (it is between
// taking the lock and writing them) or wrote something unreadable. A
// holder clears the record of the holder before (one killed with SIGKILL
// leaves it) in the first system call after taking the lock, so a dead
// holder's pid, which may be another process's by now, is named only by
// an Acquire in the window between those two calls.
type HeldError struct {
	Path    string
	PID     int
	Host    string
	Program string
}

// Error reads "lockfile: PATH is held by pid N (PROGRAM) on HOST".
func (e *HeldError) Error() string {
	return fmt.Sprintf("lockfile: %s is held by %s", e.Path, e.Holder())
}

// Holder describes the holder: "pid N (PROGRAM) on HOST", or "another
// process" when the file does not say.
func (e *HeldError) Holder() string {
	if e.PID == 0 {
		return "another process (it has not recorded its pid)"
	}
	s := "pid " + strconv.Itoa(e.PID)
	if e.Program != "" {
		s += " (" + e.Program + ")"
	}
	if e.Host != "" {
		s += " on " + e.Host
	}
	return s
}

// Is makes a HeldError match ErrLocked.
func (e *HeldError) Is(target error) bool { return target == ErrLocked }

// Lock is a lock file held by this process, from Acquire until Release. Its
// methods are safe for concurrent use.
type Lock struct {
	path string
	fi   os.FileInfo // the locked file's identity

	mu sync.Mutex
	f  *os.File // nil once released
}

// Acquire takes the lock file at path, creating it (mode 0644) if it does
// not exist; its folder must exist. It does not wait: if another open file
// holds the lock, in this process or another, it returns a *HeldError
// (matching ErrLocked) with the holder's pid, host and program as the
// holder recorded them. Once it has the lock it records this process's in
// the file.
//
// A symbolic link at path is never followed (ErrLink, naming it): the
// lock file is truncated and written, and a link planted in a folder a
// service manages must not make it write a file outside.
func Acquire(path string) (*Lock, error) { return acquireIn(osDir{}, path, path) }

// AcquireIn is Acquire of the lock file name in the folder root: it is
// opened through root, so no link on the way to it is followed out of
// root, and a link at name is refused as Acquire refuses one.
func AcquireIn(root *os.Root, name string) (*Lock, error) {
	return acquireIn(root, name, filepath.Join(root.Name(), name))
}

// dir opens files: the filesystem (osDir), or an os.Root.
type dir interface {
	OpenFile(name string, flag int, perm os.FileMode) (*os.File, error)
	Lstat(name string) (os.FileInfo, error)
	Readlink(name string) (string, error)
}

type osDir struct{}

func (osDir) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag, perm)
}
func (osDir) Lstat(name string) (os.FileInfo, error) { return os.Lstat(name) }
func (osDir) Readlink(name string) (string, error)   { return os.Readlink(name) }

// acquireIn takes the lock file name in d; path is its path, for messages
// and Check.
func acquireIn(d dir, name, path string) (*Lock, error) {
	for attempt := 0; ; attempt++ {
		if err := refuseLink(d, name, path); err != nil {
			return nil, err
		}
		f, err := d.OpenFile(name, os.O_RDWR|os.O_CREATE|noFollow, 0o644)
		if err != nil {
			if err := refuseLink(d, name, path); err != nil {
				return nil, err // swapped in since the check
			}
			return nil, fmt.Errorf("lockfile: %w", err)
		}
		if err := take(f); err != nil {
			if errors.Is(err, errWouldBlock) {
				held := readHolder(f, path)
				f.Close()
				return nil, held
			}
			f.Close()
			return nil, fmt.Errorf("lockfile: locking %s: %w", path, err)
		}
		// The file locked must still be the one at path: another process
		// may have replaced or removed it between the open and the lock.
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lockfile: %w", err)
		}
		if now, err := d.Lstat(name); err != nil || !os.SameFile(fi, now) {
			f.Close()
			if attempt < 10 {
				continue
			}
			return nil, fmt.Errorf("lockfile: %s keeps being replaced while it is locked", path)
		}
		if err := writeHolder(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("lockfile: writing %s: %w", path, err)
		}
		return &Lock{path: path, fi: fi, f: f}, nil
	}
}

// take locks f without waiting (errWouldBlock when another open file holds
// the lock) and at once clears the record of the holder before, which one
// that died without Release leaves: from then on until writeHolder, an
// Acquire that finds the lock held says no holder is recorded (PID 0)
// rather than name a process that no longer holds it.
func take(f *os.File) error {
	if err := lock(f); err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		unlock(f)
		return err
	}
	return nil
}

// ErrLink: a lock file's path is a symbolic link, which Acquire does not
// follow.
var ErrLink = errors.New("is a symbolic link")

// refuseLink returns an error wrapping ErrLink, naming path and its target,
// when name in d is a symbolic link.
func refuseLink(d dir, name, path string) error {
	fi, err := d.Lstat(name)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return nil
	}
	target, _ := d.Readlink(name)
	return fmt.Errorf("lockfile: %s %w (to %s): a lock file is never followed through a link; remove the link", path, ErrLink, target)
}

// Path returns the lock file's path.
func (l *Lock) Path() string { return l.path }

// Check returns nil while the file at the lock's path is the file locked,
// and an error matching ErrLost once it was deleted, renamed or replaced
// (or a folder above it was). It costs one stat.
func (l *Lock) Check() error {
	fi, err := os.Stat(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s is gone", ErrLost, l.path)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrLost, err)
	}
	if !os.SameFile(fi, l.fi) {
		return fmt.Errorf("%w: %s is another file now", ErrLost, l.path)
	}
	return nil
}

// Release clears the holder's record (best effort: it is only
// informative) and drops the lock; the file stays, empty. Later calls do
// nothing.
func (l *Lock) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	l.f.Truncate(0) // while held (the next holder's record comes after); only informative, so best effort
	err := unlock(l.f)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	if err != nil {
		return fmt.Errorf("lockfile: releasing %s: %w", l.path, err)
	}
	return nil
}

// writeHolder records this process in the locked file f:
//
//	pid 1234
//	host node-a
//	program tensorwire
func writeHolder(f *os.File) error {
	host, _ := os.Hostname()
	prog := ""
	if len(os.Args) > 0 {
		prog = filepath.Base(os.Args[0])
	}
	data := fmt.Sprintf("pid %d\nhost %s\nprogram %s\n", os.Getpid(), oneLine(host), oneLine(prog))
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(data), 0)
	return err
}

func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// holderWait bounds how long readHolder waits for a holder that has taken
// the lock but not yet written its pid.
const holderWait = 200 * time.Millisecond

// readHolder reads what the holder of f's lock recorded, waiting a little
// if it has not written it yet.
func readHolder(f *os.File, path string) *HeldError {
	e := &HeldError{Path: path}
	deadline := time.Now().Add(holderWait)
	for {
		data, err := io.ReadAll(io.NewSectionReader(f, 0, 4096))
		if err == nil {
			parseHolder(data, e)
		}
		if e.PID != 0 || time.Now().After(deadline) {
			return e
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func parseHolder(data []byte, e *HeldError) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		switch k {
		case "pid":
			if e.PID == 0 {
				if n, err := strconv.Atoi(v); err == nil && n > 0 {
					e.PID = n
				}
			}
		case "host":
			if e.Host == "" {
				e.Host = v
			}
		case "program":
			if e.Program == "" {
				e.Program = v
			}
		}
	}
}
