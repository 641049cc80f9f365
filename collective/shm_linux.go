//go:build linux

package collective

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorwire/tensorwire/internal/lockfile"
)

// The shared-mapping transport. Each rank owns three files in the
// session's folder under Config.ShmDir, which every rank of the session
// maps:
//
//	rank-R.ctl   its control words and the descriptions of its calls
//	rank-R.d0    the data it publishes for even-numbered collectives
//	rank-R.d1    ... and for odd-numbered ones
//	rank-R.lock  held (flock) while the rank lives
//
// A rank publishes its input once, into its own data file, and reads what
// it needs straight from the others' mappings: no byte crosses a socket.
// The ranks synchronise through one word each, the phase, which only its
// owner writes and which only grows: every collective moves it three steps
// (published, reduced, done). Waiting for a peer is reading its phase
// until it is far enough: a short spin, then a futex wait on the word
// (the owner wakes waiters when it moves it), rechecking the context, the
// peer's abort word and the communicator's health every few milliseconds.
//
// Two data files let a rank publish collective k+1 while slower ranks
// still read what it published for k: it waits only for every rank to be
// done with k-1, which used the same file.

// Control file layout: one word per cache line.
const (
	ctlMagic    = 0
	ctlPhase    = 64
	ctlWaiters  = 128
	ctlAbort    = 192
	ctlCap      = 256 // two uint64: the data files' sizes
	ctlDescLen  = 320 // two uint32: the descriptions' lengths
	ctlDesc     = 4096
	ctlDescRoom = 64 << 10
	ctlSize     = ctlDesc + 2*ctlDescRoom

	shmMagic = 0x7477636f // "twco"
)

// shmGroup is this rank's view of the session's mappings.
type shmGroup struct {
	c    *Comm
	dir  string
	me   int
	n    int
	lock *lockfile.Lock
	ctl  [][]byte    // every rank's control file; ours writable
	own  [2]*os.File // our data files
	data [][2][]byte // every rank's data files as mapped here
}

// makeSessionDir makes rank 0's folder for a session under dir, with a
// marker file the other ranks look for, after removing the folders of
// sessions whose ranks are all dead.
func makeSessionDir(dir string, session uint64) (string, error) {
	sweepSessions(dir)
	d := filepath.Join(dir, fmt.Sprintf("tensorwire-collective-%016x", session))
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(d, "session"), []byte(fmt.Sprintf("%016x\n", session)), 0o600); err != nil {
		os.RemoveAll(d)
		return "", err
	}
	return d, nil
}

// sweepSessions removes the session folders under dir that no live rank
// holds: those older than a minute whose lock files are all free.
func sweepSessions(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "tensorwire-collective-") {
			continue
		}
		d := filepath.Join(dir, e.Name())
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue
		}
		locks, _ := filepath.Glob(filepath.Join(d, "rank-*.lock"))
		alive := false
		for _, p := range locks {
			l, err := lockfile.Acquire(p)
			if err != nil {
				alive = true
				break
			}
			l.Release()
		}
		if !alive {
			os.RemoveAll(d)
		}
	}
}

// openShm makes this rank's files in the session folder dir.
func openShm(c *Comm, dir string) (*shmGroup, error) {
	want := fmt.Sprintf("%016x\n", c.session)
	if b, err := os.ReadFile(filepath.Join(dir, "session")); err != nil || string(b) != want {
		return nil, fmt.Errorf("rank %d does not see rank 0's folder %s", c.rank, dir)
	}
	g := &shmGroup{c: c, dir: dir, me: c.rank, n: c.size, ctl: make([][]byte, c.size), data: make([][2][]byte, c.size)}
	var err error
	if g.lock, err = lockfile.Acquire(g.path("lock")); err != nil {
		return nil, err
	}
	ctl, err := createMapped(g.path("ctl"), ctlSize)
	if err != nil {
		g.close()
		return nil, err
	}
	g.ctl[g.me] = ctl
	for i := range 2 {
		f, err := os.OpenFile(g.path(fmt.Sprintf("d%d", i)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			g.close()
			return nil, err
		}
		g.own[i] = f
	}
	atomic.StoreUint32(g.word(g.me, ctlMagic), shmMagic)
	return g, nil
}

func (g *shmGroup) path(what string) string {
	return filepath.Join(g.dir, fmt.Sprintf("rank-%d.%s", g.me, what))
}

func (g *shmGroup) peerPath(r int, what string) string {
	return filepath.Join(g.dir, fmt.Sprintf("rank-%d.%s", r, what))
}

// createMapped creates a file of size bytes and maps it shared.
func createMapped(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Reserve the pages before writing through the mapping: on a full
	// tmpfs a write into a hole is SIGBUS, a failed fallocate an error.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil && err != unix.EOPNOTSUPP {
		return nil, fmt.Errorf("reserving %d bytes for %s: %w", size, path, err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		return nil, err
	}
	return unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// mapFile maps size bytes of path, shared; read-only unless write.
func mapFile(path string, size int, write bool) ([]byte, error) {
	flag, prot := os.O_RDONLY, unix.PROT_READ
	if write {
		flag, prot = os.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return unix.Mmap(int(f.Fd()), 0, size, prot, unix.MAP_SHARED)
}

// attach maps the other ranks' control files (every rank made its own
// before the rendezvous' second round).
func (g *shmGroup) attach() error {
	for r := range g.n {
		if r == g.me {
			continue
		}
		// The control words are written by their owner only; we map them
		// writable all the same, as futex needs the word's page mapped
		// the same way by waiter and waker on some kernels.
		m, err := mapFile(g.peerPath(r, "ctl"), ctlSize, true)
		if err != nil {
			return err
		}
		g.ctl[r] = m
		if atomic.LoadUint32(g.word(r, ctlMagic)) != shmMagic {
			return fmt.Errorf("rank %d's control file is not initialised", r)
		}
	}
	return nil
}

func (g *shmGroup) close() {
	for r := range g.n {
		if g.ctl[r] != nil {
			unix.Munmap(g.ctl[r])
			g.ctl[r] = nil
		}
		for i := range 2 {
			if g.data[r][i] != nil {
				unix.Munmap(g.data[r][i])
				g.data[r][i] = nil
			}
		}
	}
	for i, f := range g.own {
		if f != nil {
			f.Close()
			os.Remove(g.path(fmt.Sprintf("d%d", i)))
		}
	}
	os.Remove(g.path("ctl"))
	if g.lock != nil {
		g.lock.Release()
		os.Remove(g.path("lock"))
	}
	// The last rank out removes the folder.
	if ents, err := os.ReadDir(g.dir); err == nil && len(ents) <= 1 {
		os.Remove(filepath.Join(g.dir, "session"))
		os.Remove(g.dir)
	}
}

// word returns a pointer to the uint32 at off in rank r's control file.
func (g *shmGroup) word(r, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&g.ctl[r][off]))
}

func (g *shmGroup) word64(r, off int) *uint64 {
	return (*uint64)(unsafe.Pointer(&g.ctl[r][off]))
}

// setPhase moves our phase to p and wakes the ranks waiting on it.
func (g *shmGroup) setPhase(p uint32) {
	w := g.word(g.me, ctlPhase)
	atomic.StoreUint32(w, p)
	if atomic.LoadUint32(g.word(g.me, ctlWaiters)) != 0 {
		futexWake(w)
	}
}

// abort marks every phase past ours as never coming, and wakes waiters.
func (g *shmGroup) abort() {
	p := atomic.LoadUint32(g.word(g.me, ctlPhase)) + 1
	atomic.StoreUint32(g.word(g.me, ctlAbort), p)
	futexWake(g.word(g.me, ctlPhase))
}

// reached reports whether phase v is at or past p (modulo wrap-around).
func reached(v, p uint32) bool { return int32(v-p) >= 0 }

// waitAll waits until every rank in ranks has reached phase p.
func (g *shmGroup) waitAll(ctx context.Context, p uint32) error {
	for r := range g.n {
		if r == g.me {
			continue
		}
		if err := g.waitRank(ctx, r, p); err != nil {
			return err
		}
	}
	return nil
}

// spins is how many times a waiter reads a peer's phase before it yields
// and then sleeps on the futex.
const (
	spins   = 200
	yields  = 8
	napTime = 5 * time.Millisecond
)

func (g *shmGroup) waitRank(ctx context.Context, r int, p uint32) error {
	w := g.word(r, ctlPhase)
	for i := 0; i < spins; i++ {
		if reached(atomic.LoadUint32(w), p) {
			return nil
		}
	}
	for i := 0; i < yields; i++ {
		runtime.Gosched()
		if reached(atomic.LoadUint32(w), p) {
			return nil
		}
	}
	waiters := g.word(r, ctlWaiters)
	for {
		v := atomic.LoadUint32(w)
		if reached(v, p) {
			return nil
		}
		if a := atomic.LoadUint32(g.word(r, ctlAbort)); a != 0 && !reached(v, a) && reached(p, a) {
			err := errorf(ErrAborted, "rank %d abandoned collective %d", r, g.c.seq)
			g.c.fail(err)
			return err
		}
		if err := g.c.err(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		atomic.AddUint32(waiters, 1)
		if v == atomic.LoadUint32(w) {
			futexWait(w, v, napTime)
		}
		atomic.AddUint32(waiters, ^uint32(0))
	}
}

// publish makes our data file i at least n bytes and returns its mapping.
func (g *shmGroup) publish(i, n int) ([]byte, error) {
	cur := g.data[g.me][i]
	if len(cur) >= n {
		return cur[:n], nil
	}
	size := max(n, 1<<20)
	if len(cur) > 0 {
		size = max(size, 2*len(cur))
	}
	size = (size + 4095) &^ 4095
	// Reserve the pages: a write into a hole of a full tmpfs through a
	// mapping is SIGBUS, a failed fallocate a clear error.
	if err := unix.Fallocate(int(g.own[i].Fd()), 0, 0, int64(size)); err != nil && err != unix.EOPNOTSUPP {
		return nil, fmt.Errorf("reserving %d bytes in %s: %w", size, g.dir, err)
	}
	if err := g.own[i].Truncate(int64(size)); err != nil {
		return nil, err
	}
	m, err := unix.Mmap(int(g.own[i].Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	if cur != nil {
		unix.Munmap(cur)
	}
	g.data[g.me][i] = m
	atomic.StoreUint64(g.word64(g.me, ctlCap+8*i), uint64(size))
	return m[:n], nil
}

// peerData returns n bytes of rank r's data file i, mapping it again if it
// grew.
func (g *shmGroup) peerData(r, i, n int) ([]byte, error) {
	if r == g.me {
		return g.data[g.me][i][:n], nil
	}
	cur := g.data[r][i]
	if len(cur) >= n {
		return cur[:n], nil
	}
	size := int(atomic.LoadUint64(g.word64(r, ctlCap+8*i)))
	if size < n {
		return nil, fmt.Errorf("rank %d published %d bytes, %d expected", r, size, n)
	}
	m, err := mapFile(g.peerPath(r, fmt.Sprintf("d%d", i)), size, false)
	if err != nil {
		return nil, err
	}
	if cur != nil {
		unix.Munmap(cur)
	}
	g.data[r][i] = m
	return m[:n], nil
}

// putDesc writes our description for file set i.
func (g *shmGroup) putDesc(i int, b []byte) {
	copy(g.ctl[g.me][ctlDesc+i*ctlDescRoom:], b)
	atomic.StoreUint32(g.word(g.me, ctlDescLen+4*i), uint32(len(b)))
}

// desc reads rank r's description for file set i.
func (g *shmGroup) desc(r, i int) (desc, error) {
	n := int(atomic.LoadUint32(g.word(r, ctlDescLen+4*i)))
	if n > ctlDescRoom {
		return desc{}, fmt.Errorf("rank %d's description is %d bytes", r, n)
	}
	b := make([]byte, n)
	copy(b, g.ctl[r][ctlDesc+i*ctlDescRoom:])
	return decodeDesc(b)
}

func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, uintptr(1<<30), 0, 0, 0)
}

// futex operations (linux/futex.h), on shared words: not FUTEX_PRIVATE.
const (
	futexOpWait = 0
	futexOpWake = 1
)
