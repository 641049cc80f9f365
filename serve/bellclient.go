package serve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/rpc"
)

// The client's side of the bell (bell.go).

// clientRing is a client's ring and the node's bell it rings.
type clientRing struct {
	v *ringView // the ring file's mapping: valid until Close

	mu      sync.Mutex // appending; the bell and seq
	bell    *shm.Map   // the node's bell; nil until registered with one
	bellDir string     // the bell's folder, relative to the root; "" with none
	seq     []uint32   // per first row: the last sequence number sent
}

// bellers counts the process's requests by bell between their push and
// their answer, of every Client: the goroutines a sleeping waiter would
// keep from a P (waitBell).
var bellers atomic.Int32

const (
	// bellSpins is how many times a waiter reads its record before it
	// yields, and then sleeps on the record's word.
	bellSpins  = 100
	bellYields = 4
	// bellNap bounds a waiter's sleep on its record. Its context ending
	// and Close wake it; the nap only bounds how late it sees a
	// registration made by another request, and it must be long: 128
	// clients waking every 5 ms cost a core.
	bellNap = 100 * time.Millisecond
	// bellProbe is how long a waiter waits before it asks the node (by
	// call) whether it still holds the client's registration, and again
	// after each such interval.
	bellProbe = 500 * time.Millisecond
	// quietWait bounds how long a Predict that its context ended keeps its
	// slots, waiting for the node to be done writing them (Client.quiet,
	// which tests change).
	quietWait = 30 * time.Second
)

// errRepush: the registration changed while a request waited (the node
// restarted): send it again.
var errRepush = errors.New("serve: registered again: send the request again")

// errNoBellYet: the client has a ring but the node gave it no bell: the
// request goes by call.
var errNoBellYet = errors.New("serve: no bell")

// makeRing makes the ring file in the client's folder being made.
func (c *Client) makeRing(dir string) error {
	if !bellSupported {
		return nil
	}
	size, _ := ringSize(c.slots)
	b, err := createShared(filepath.Join(dir, "ring"), size)
	if err != nil {
		return err
	}
	v, err := newRingView(b, c.slots)
	if err != nil {
		unmapShared(b)
		return err
	}
	c.ring = &clientRing{v: v, seq: make([]uint32, c.slots)}
	return nil
}

// useBell maps the bell the node named at registration (rel, under the
// root), replacing the one before; "" means none.
func (c *Client) useBell(rel string) error {
	if c.ring == nil {
		return nil
	}
	var b *shm.Map
	if rel != "" {
		if !bellDirRE.MatchString(rel) {
			return fmt.Errorf("serve: the node named the bell %q", rel)
		}
		f, err := os.OpenFile(filepath.Join(c.root, filepath.FromSlash(rel), "bell"), os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("serve: the node's bell: %w", err)
		}
		b, err = openShared(f, bellSize)
		f.Close()
		if err != nil {
			return fmt.Errorf("serve: the node's bell: %w", err)
		}
	}
	c.ring.mu.Lock()
	old := c.ring.bell
	c.ring.bell, c.ring.bellDir = b, rel
	c.ring.mu.Unlock()
	unmapShared(old)
	return nil
}

// push appends a request for rows [start, start+n) to the ring and rings
// the bell; it returns the request's sequence number. gen is the
// registration the caller will wait under: once it changed, push returns
// errRepush without appending (the request would run under the new one,
// and be sent again). A full ring is waited on as waitBell waits: until
// the context ends or the client closes (ErrClosed), asking the node every
// bellProbe whether it holds the registration. A ring stays full when the
// node is gone with requests in it; registering again empties it.
func (c *Client) push(ctx context.Context, start, n int, gen uint64) (uint32, error) {
	r := c.ring
	probe := time.Now().Add(bellProbe)
	for {
		r.mu.Lock()
		if r.bell == nil {
			r.mu.Unlock()
			return 0, errNoBellYet
		}
		if c.gen.Load() != gen {
			r.mu.Unlock()
			return 0, errRepush
		}
		t := r.v.tail().Load()
		if t-r.v.head().Load() < uint64(r.v.slots) {
			seq := (r.seq[start] + 1) & entrySeqMask
			if seq == 0 {
				seq = 1 // 0 is a record's "nothing done"
			}
			r.seq[start] = seq
			r.v.entry(t).Store(makeEntry(start, n, seq))
			r.v.tail().Store(t + 1)
			ring := r.bell.Uint32(bellRing)
			ring.Add(1)
			if r.bell.Uint32(bellSleep).Load() != 0 {
				ring.Wake()
			}
			r.mu.Unlock()
			return seq, nil
		}
		r.mu.Unlock()
		// The ring is full: the node has not taken the requests before
		// (more calls on overlapping rows than the slots, or a node gone).
		if c.isClosed() {
			return 0, ErrClosed
		}
		if time.Now().After(probe) {
			if err := c.probe(ctx); err != nil {
				return 0, err
			}
			probe = time.Now().Add(bellProbe)
		}
		if err := sleep(ctx, 100*time.Microsecond); err != nil {
			return 0, err
		}
	}
}

// predictBell runs rows [start, start+n) by bell: it returns the version,
// and the request's sequence number (0 if it was never sent).
func (c *Client) predictBell(ctx context.Context, start, n int) (uint64, uint32, error) {
	c.use.RLock() // Close unmaps the ring once no request uses it
	defer c.use.RUnlock()
	if c.isClosed() {
		return 0, 0, ErrClosed
	}
	bellers.Add(1)
	defer bellers.Add(-1)
	wait := 20 * time.Millisecond
	for {
		gen := c.gen.Load()
		seq, err := c.push(ctx, start, n, gen)
		if errors.Is(err, errRepush) {
			continue
		}
		if err != nil {
			return 0, 0, err
		}
		v, err := c.waitBell(ctx, start, seq, gen)
		switch {
		case errors.Is(err, errRepush):
			continue
		case errors.Is(err, rpc.ErrUnavailable) && !errors.Is(err, rpc.ErrClosed) && !c.isClosed():
			// The request failed with Unavailable (the manager stopped:
			// the node is going down), or the failure could not be
			// fetched: send it again after a backoff, as a call is.
			if serr := sleep(ctx, wait); serr != nil {
				return 0, seq, fmt.Errorf("%w; the node was unavailable: %w", serr, err)
			}
			wait = min(2*wait, time.Second)
			continue
		}
		return v, seq, err
	}
}

// waitBell waits for the record of request seq at start: a short spin,
// then sleeps on the record's word. It asks the node every bellProbe
// whether it still holds the registration, and registers again if not.
func (c *Client) waitBell(ctx context.Context, start int, seq uint32, gen uint64) (uint64, error) {
	v := c.ring.v
	done := v.done(start)
	for i := range bellSpins + bellYields {
		if done.Load() == seq {
			return c.result(ctx, start, seq)
		}
		if i >= bellSpins {
			shm.Yield()
		}
	}
	// Its context ending wakes it.
	defer context.AfterFunc(ctx, done.Wake)()
	probe := time.Now().Add(bellProbe)
	for {
		d := done.Load()
		if d == seq {
			return c.result(ctx, start, seq)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if c.isClosed() {
			return 0, ErrClosed
		}
		if c.gen.Load() != gen {
			return 0, errRepush
		}
		if time.Now().After(probe) {
			if err := c.probe(ctx); err != nil {
				return 0, err
			}
			probe = time.Now().Add(bellProbe)
			continue
		}
		// With other requests by bell under way in this process (of this
		// client or another), their goroutines run first: one asleep in
		// the kernel keeps its P until the runtime's monitor takes it
		// back, which can be milliseconds later, and their requests would
		// wait for that instead of joining a batch. (Alone, it does not
		// yield: Gosched wakes an idle P to spin, a cost with no goroutine
		// to gain.)
		if bellers.Load() > 1 {
			runtime.Gosched()
			if done.Load() != d {
				continue
			}
		}
		v.waiters(start).Add(1)
		if done.Load() == d && ctx.Err() == nil && !c.isClosed() {
			done.Wait(d, min(bellNap, time.Until(probe)+time.Millisecond))
		}
		v.waiters(start).Add(^uint32(0))
	}
}

// probe asks the node whether it holds the client's registration, and
// registers again (which changes c.gen) if it does not. An unreachable
// node is not an error: the request waits for it.
func (c *Client) probe(ctx context.Context) error {
	c.mu.Lock()
	id := c.id
	c.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, bellProbe)
	defer cancel()
	_, err := rpc.Call[rpc.Empty](pctx, c.rc, MethodRenew, clientRequest{Name: c.name, Client: id})
	switch {
	case err == nil, errors.Is(err, rpc.ErrUnavailable), errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return nil
	case errors.Is(err, ErrNotRegistered):
		if err := c.register(ctx, id); err != nil && !errors.Is(err, rpc.ErrUnavailable) {
			return err
		}
		return nil
	}
	return err
}

// result reads a record that says request seq is done.
func (c *Client) result(ctx context.Context, start int, seq uint32) (uint64, error) {
	v := c.ring.v
	if v.status(start).Load() == 0 {
		return v.version(start).Load(), nil
	}
	c.mu.Lock()
	id := c.id
	c.mu.Unlock()
	// A call, not retried: the error it returns is the request's, which
	// may itself be Unavailable (ErrStopped); predictBell retries those.
	_, err := rpc.Call[rpc.Empty](ctx, c.rc, MethodFailure, failureRequest{Name: c.name, Client: id, Start: start, Seq: seq})
	if err == nil {
		err = fmt.Errorf("serve: the node said request %d failed, then that it did not", seq)
	}
	return 0, err
}

// waitQuiet waits until request seq at start is done, the client closed,
// c.quiet passed, or the node the request was sent to is dead: how long a
// Predict that its context ended keeps its slots, which the node may still
// write. A node that died (killed while the request waited) never writes
// them, and its successor never answers the request: without the last
// check, a client by bell whose calls ended while its node was down had
// those slots taken for 30 s after the node came back.
func (c *Client) waitQuiet(start int, seq uint32) {
	c.ring.mu.Lock()
	sentTo := c.ring.bellDir // the bell the request was rung on (or a later one: then it waits)
	c.ring.mu.Unlock()
	done := c.ring.v.done(start)
	for deadline := time.Now().Add(c.quiet); time.Now().Before(deadline) && !c.isClosed(); {
		if done.Load() == seq {
			return
		}
		c.ring.mu.Lock()
		now := c.ring.bellDir
		c.ring.mu.Unlock()
		if sentTo != "" && now != sentTo && c.bellDead(sentTo) {
			return
		}
		time.Sleep(bellNap)
	}
}

// bellDead reports whether the node whose bell is the folder rel (under
// the root) is gone: the lock it holds while it runs is free, or its
// folder was removed (it closed the bell, or it died and a client swept
// it).
func (c *Client) bellDead(rel string) bool {
	l, err := lockfile.Acquire(filepath.Join(c.root, filepath.FromSlash(rel), "lock"))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	l.Release()
	return true
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// closeRing wakes the requests waiting by bell (c.closed is set), waits
// for them to return, and unmaps the ring and the bell.
func (c *Client) closeRing() {
	if c.ring == nil {
		return
	}
	// Under a fault guard: a truncated ring must not crash Close.
	c.ring.v.b.Guard(func() error {
		for s := range c.ring.v.slots {
			if c.ring.v.waiters(s).Load() > 0 {
				c.ring.v.done(s).Wake()
			}
		}
		return nil
	})
	c.use.Lock()
	defer c.use.Unlock()
	c.ring.mu.Lock()
	unmapShared(c.ring.bell)
	c.ring.bell = nil
	c.ring.mu.Unlock()
	unmapShared(c.ring.v.b)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
