//go:build linux

package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/internal/shm"
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
// (internal/shm's Wait; the owner wakes waiters when it moves it), rechecking the context, the
// peer's abort word and the communicator's health every few milliseconds.
//
// Two data files let a rank publish collective k+1 while slower ranks
// still read what it published for k: it waits only for every rank to be
// done with k-1, which used the same file.

// Control file layout: one word per cache line.
const (
	ctlMagic   = 0
	ctlPhase   = 64
	ctlWaiters = 128
	ctlAbort   = 192
	ctlCap     = 256 // two uint64: the data files' sizes
	ctlDescLen = 320 // two uint32: the descriptions' lengths
	// The progress word of a pipelined reduction (shm_pipe.go) and the
	// count of its waiters: like the phase, written by its owner only and
	// only growing, a step per chunk event.
	ctlProg        = 384
	ctlProgWaiters = 448
	ctlDesc        = 4096
	ctlDescRoom    = descMax
	ctlSize        = ctlDesc + 2*ctlDescRoom

	shmMagic = 0x7477636f // "twco"
)

// shmGroup is this rank's view of the session's mappings.
type shmGroup struct {
	c    *Comm
	dir  string
	me   int
	n    int
	lock *lockfile.Lock
	ctl  []*shm.Map    // every rank's control file; ours writable
	own  [2]*os.File   // our data files
	data [][2]*shm.Map // every rank's data files as mapped here
	// ranks are the communicator's ranks of the group's members, for
	// messages; nil: the group is the communicator (member r is rank r).
	ranks []int
	// prog is every member's progress word as the last pipelined
	// reduction left it (the same on every member: each such collective
	// moves them all by the same steps; shm_pipe.go).
	prog uint32
	// sh is this rank's shared buffers and its mappings of the others'
	// (shm_shared_linux.go); sbuf the partial results of sharedReduce.
	sh   sharedSet
	sbuf []byte
	// shared counts the calls sharedReduce ran (tests).
	shared atomic.Uint64
	// spin: waits read a peer's word for up to spinFor before yielding
	// (the group has no more ranks than usableCPUs).
	spin bool
	// inbox is this rank's inbox in the folder (p2p_inbox.go), nil when it
	// could not be made.
	inbox *inbox
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
func openShm(c *Comm, dir string) (*shmGroup, error) { return openShmGroup(c, dir, c.rank, c.size) }

// openShmGroup makes this rank's files in dir as member me of a group of n
// ranks sharing mappings: the whole communicator (openShm), or the ranks
// of one host of a hierarchical one (hier_join.go).
func openShmGroup(c *Comm, dir string, me, n int) (*shmGroup, error) {
	want := fmt.Sprintf("%016x\n", c.session)
	if b, err := os.ReadFile(filepath.Join(dir, "session")); err != nil || string(b) != want {
		return nil, fmt.Errorf("rank %d does not see rank 0's folder %s", c.rank, dir)
	}
	g := &shmGroup{c: c, dir: dir, me: me, n: n, ctl: make([]*shm.Map, n), data: make([][2]*shm.Map, n), spin: n <= usableCPUs()}
	var err error
	if g.lock, err = lockfile.Acquire(g.path("lock")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// The folder went between the two: a rank that failed (a full
			// folder, say) removed it. Said as above, not as a lock
			// file's ENOENT (TestShm_JoinOnFullFolder saw that once).
			return nil, fmt.Errorf("rank %d does not see rank 0's folder %s: it was removed meanwhile", c.rank, dir)
		}
		return nil, err
	}
	// Create reserves the pages before we write through the mapping: on
	// a full tmpfs a write into a hole is SIGBUS, a failed fallocate an
	// error.
	ctl, err := shm.Create(g.path("ctl"), ctlSize, 0o600)
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
	g.word(g.me, ctlMagic).Store(shmMagic)
	// Made before the rendezvous' second round, so that no rank can send
	// to this one before it is there.
	g.inbox = openInbox(dir, c.rank, c.size, g.spin)
	return g, nil
}

// folder returns the group's folder.
func (g *shmGroup) folder() string { return g.dir }

func (g *shmGroup) path(what string) string {
	return filepath.Join(g.dir, fmt.Sprintf("rank-%d.%s", g.me, what))
}

func (g *shmGroup) peerPath(r int, what string) string {
	return filepath.Join(g.dir, fmt.Sprintf("rank-%d.%s", r, what))
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
		m, err := shm.Open(g.peerPath(r, "ctl"), ctlSize, true)
		if err != nil {
			return err
		}
		g.ctl[r] = m
		if g.word(r, ctlMagic).Load() != shmMagic {
			return fmt.Errorf("rank %d's control file is not initialised", r)
		}
	}
	return nil
}

func (g *shmGroup) close() {
	g.inbox.close()
	for r := range g.n {
		g.ctl[r].Close()
		g.ctl[r] = nil
		for i := range 2 {
			g.data[r][i].Close()
			g.data[r][i] = nil
		}
	}
	g.closeShared()
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

// word returns the 32-bit word at off in rank r's control file.
func (g *shmGroup) word(r, off int) *shm.Uint32 { return g.ctl[r].Uint32(off) }

// word64 returns the 64-bit word at off in rank r's control file.
func (g *shmGroup) word64(r, off int) *shm.Uint64 { return g.ctl[r].Uint64(off) }

// setPhase moves our phase to p and wakes the ranks waiting on it.
func (g *shmGroup) setPhase(p uint32) {
	w := g.word(g.me, ctlPhase)
	w.Store(p)
	if g.word(g.me, ctlWaiters).Load() != 0 {
		w.Wake()
	}
}

// setProg moves our progress word to v and wakes the ranks waiting on it.
func (g *shmGroup) setProg(v uint32) {
	w := g.word(g.me, ctlProg)
	w.Store(v)
	if g.word(g.me, ctlProgWaiters).Load() != 0 {
		w.Wake()
	}
}

// abort marks every phase past ours as never coming, and wakes waiters
// (of the phase and of the progress word).
func (g *shmGroup) abort() {
	p := g.word(g.me, ctlPhase).Load() + 1
	g.word(g.me, ctlAbort).Store(p)
	g.word(g.me, ctlPhase).Wake()
	g.word(g.me, ctlProg).Wake()
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

// usableCPUs is how many CPUs this process may run on: the fewer of
// runtime.NumCPU (its affinity) and GOMAXPROCS (which follows a
// container's CPU limit unless set by hand).
func usableCPUs() int { return min(runtime.NumCPU(), runtime.GOMAXPROCS(0)) }

// spins is how many times a waiter reads a peer's phase before it yields
// and then sleeps on the futex; a group with no more ranks than this
// process may use CPUs (each rank can have a core) reads for up to
// spinFor more first, since a futex sleep and wake cost tens of
// microseconds where a small collective takes one or two
// (docs/benchmarks.md, "Waits that spin while each rank has a core").
const (
	spins   = 200
	spinFor = 20 * time.Microsecond
	yields  = 8
	napTime = 5 * time.Millisecond
)

// waitProgAll waits until every other rank's progress word has reached v,
// in the collective whose done phase is phase (a rank that aborted before
// it fails the wait).
func (g *shmGroup) waitProgAll(ctx context.Context, v, phase uint32) error {
	for r := range g.n {
		if r == g.me {
			continue
		}
		if err := g.waitWord(ctx, r, ctlProg, v, phase); err != nil {
			return err
		}
	}
	return nil
}

func (g *shmGroup) waitRank(ctx context.Context, r int, p uint32) error {
	return g.waitWord(ctx, r, ctlPhase, p, p)
}

// waitWord waits until rank r's word at off (the phase or the progress
// word; its waiters' count is the next cache line) has reached v, failing
// when r aborted before reaching phase.
func (g *shmGroup) waitWord(ctx context.Context, r, off int, v, phase uint32) error {
	w := g.word(r, off)
	for i := 0; i < spins; i++ {
		if reached(w.Load(), v) {
			return nil
		}
	}
	if g.spin {
		for start := time.Now(); time.Since(start) < spinFor; {
			for range 64 {
				if reached(w.Load(), v) {
					return nil
				}
			}
		}
	}
	for i := 0; i < yields; i++ {
		shm.Yield()
		if reached(w.Load(), v) {
			return nil
		}
	}
	waiters := g.word(r, off+64) // ctlWaiters or ctlProgWaiters: the next cache line
	for {
		cur := w.Load()
		if reached(cur, v) {
			return nil
		}
		if a := g.word(r, ctlAbort).Load(); a != 0 && !reached(g.word(r, ctlPhase).Load(), a) && reached(phase, a) {
			// Rank r gave up. Why (a rank lost, say) reaches this
			// rank's own watches within milliseconds, and is the
			// error to report: wait that long for it first.
			if err := g.c.causeWithin(ctx, abortCauseWait); err != nil {
				return err
			}
			who := r
			if g.ranks != nil {
				who = g.ranks[r]
			}
			// The collective in flight (c.seq is already the next one's
			// number); none when Close waits for the others.
			err := errorf(ErrAborted, "rank %d abandoned collective %d", who, g.c.inflight.Load())
			if f := g.c.inflight.Load(); f < 0 {
				err = errorf(ErrAborted, "rank %d abandoned a collective", who)
			}
			g.c.fail(err)
			return err
		}
		if err := g.c.err(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		waiters.Add(1)
		if cur == w.Load() {
			w.Wait(cur, napTime)
		}
		waiters.Add(^uint32(0))
	}
}

// publish makes our data file i at least n bytes and returns its mapping.
func (g *shmGroup) publish(i, n int) ([]byte, error) {
	cur := bytesOf(g.data[g.me][i])
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
	if err := shm.Grow(g.own[i], size); err != nil {
		return nil, err
	}
	m, err := shm.MapFile(g.own[i], size, true)
	if err != nil {
		return nil, err
	}
	g.data[g.me][i].Close()
	g.data[g.me][i] = m
	g.word64(g.me, ctlCap+8*i).Store(uint64(size))
	return m.Bytes()[:n], nil
}

// peerData returns n bytes of rank r's data file i, mapping it again if it
// grew.
func (g *shmGroup) peerData(r, i, n int) ([]byte, error) {
	if r == g.me {
		return bytesOf(g.data[g.me][i])[:n], nil
	}
	cur := bytesOf(g.data[r][i])
	if len(cur) >= n {
		return cur[:n], nil
	}
	size := int(g.word64(r, ctlCap+8*i).Load())
	if size < n {
		return nil, ownErr(fmt.Errorf("rank %d published %d bytes, %d expected", r, size, n))
	}
	m, err := shm.Open(g.peerPath(r, fmt.Sprintf("d%d", i)), size, false)
	if err != nil {
		return nil, ownErr(err)
	}
	g.data[r][i].Close()
	g.data[r][i] = m
	return m.Bytes()[:n], nil
}

// bytesOf returns m's bytes; none for nil, a file not mapped yet.
func bytesOf(m *shm.Map) []byte {
	if m == nil {
		return nil
	}
	return m.Bytes()
}

// putDesc writes our description for file set i.
func (g *shmGroup) putDesc(i int, b []byte) {
	copy(g.ctl[g.me].Bytes()[ctlDesc+i*ctlDescRoom:], b)
	g.word(g.me, ctlDescLen+4*i).Store(uint32(len(b)))
}

// desc reads rank r's description for file set i.
func (g *shmGroup) desc(r, i int) (desc, error) {
	n := int(g.word(r, ctlDescLen+4*i).Load())
	if n > ctlDescRoom {
		return desc{}, fmt.Errorf("rank %d's description is %d bytes", r, n)
	}
	b := make([]byte, n)
	copy(b, g.ctl[r].Bytes()[ctlDesc+i*ctlDescRoom:])
	return decodeDesc(b)
}
