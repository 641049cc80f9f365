package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Client is a store served by a node (Service), used from another process
// or machine with the same calls as a local Store. Many calls may be in
// flight at once: each rides its own stream of the client's one
// connection, and the node answers them as they complete.
//
// When the client and the node share a filesystem (the client's root,
// WithRoot, has the node root's identity) and the store lives under it,
// values of Options.InlineBytes or more never cross the network: Put,
// Append and Publish write them into a prefix in the store's staging
// folder and send its name, and the node renames it into place; Get, Peek,
// Latest and WaitNewer send the prefix's path, which the client maps
// read-only. Smaller values, and every value otherwise, travel as bytes.
// SharedFS says which. Through another page cache (Sharing is rpc.Storage:
// another host on NFS) Get and Peek copy each value out of its prefix
// before they return, since the node unlinks a prefix Options.TrashGrace
// after its item leaves the bin and a mapping on another host faults from
// then on; parameters stay mapped, under their leases.
//
// Calls ride out the node restarting: a call that finds the node
// unreachable is tried again, with backoff, until its context ends, and
// no Put, Append, Delete, Publish or Get is applied twice (each carries an
// id the node remembers). A Client is safe for concurrent use; Close it
// when done, after closing the Params it returned.
type Client struct {
	rc      *rpc.Client
	calls   service.Caller // rc's calls, tried again while the node is unreachable
	name    string
	o       dialOptions
	client  uint64 // this client's id in its requests' ids
	seq     atomic.Uint64
	info    infoResponse
	ref     bool
	sharing rpc.Sharing // at Dial
	dir     string      // the store's folder on this side, in ref mode

	bg   context.Context // ends at Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	closed bool
	leases map[uint64]*heldLease
}

type heldLease struct {
	ref leaseRef
	p   *Param
}

// DialOption configures Dial.
type DialOption func(*dialOptions)

type dialOptions struct {
	service.Dialing // root, bytes, rpc's options
}

// WithRoot sets this side's view of the shared root (rpc.WithRoot), which
// lets the client move large values by reference when the node shares it.
func WithRoot(dir string) DialOption { return func(o *dialOptions) { o.Root = dir } }

// WithBytes makes values travel as bytes even when the filesystem is
// shared.
func WithBytes() DialOption { return func(o *dialOptions) { o.Bytes = true } }

// WithRPC passes options to rpc.Dial: a token, TLS, a logger, limits.
func WithRPC(opts ...rpc.Option) DialOption {
	return func(o *dialOptions) { o.RPC = append(o.RPC, opts...) }
}

// Dial connects to the store served as name by the node at addr.
// ErrNotFound if the node serves no store of that name.
func Dial(ctx context.Context, addr, name string, opts ...DialOption) (*Client, error) {
	var o dialOptions
	for _, opt := range opts {
		opt(&o)
	}
	rc, err := o.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	c := &Client{rc: rc, name: name, o: o, client: random64(), leases: map[uint64]*heldLease{}}
	c.bg, c.stop = context.WithCancel(context.Background())
	fail := func(err error) (*Client, error) {
		c.stop()
		rc.Close()
		return nil, err
	}
	c.calls = service.Caller{RPC: rc, Methods: repeatable, Closed: c.isClosed, ErrClosed: ErrClosed}
	if c.info, err = service.Call[infoResponse](ctx, &c.calls, MethodInfo, storeRequest{Store: name}); err != nil {
		return fail(err)
	}
	// Values are written once (staged, synced, renamed into place, opened
	// after, never rewritten): the same files suffice, one page cache is
	// not needed (rpc.Storage).
	var ref bool
	if c.sharing, ref, err = o.Mode(ctx, rc, c.info.Dir != "", rpc.Storage); err != nil {
		return fail(err)
	}
	if ref {
		abs, err := filepath.Abs(o.Root)
		if err != nil {
			return fail(err)
		}
		c.ref, c.dir = true, filepath.Join(abs, filepath.FromSlash(c.info.Dir))
	}
	c.wg.Add(1)
	go c.renewLoop()
	return c, nil
}

func random64() uint64 {
	for {
		var b [8]byte
		rand.Read(b[:])
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// SharedFS reports whether large values stay in the shared folder; false
// when every value travels with the calls. Values are written once, so a
// client that sees the node's files through another page cache (two
// machines on NFS: Sharing is rpc.Storage) keeps them there too.
func (c *Client) SharedFS() bool { return c.ref }

// Sharing returns how much of the node's root this client shares, as its
// connection's handshake decided at Dial (rpc.None without a root, or for
// a store not under the node's root; WithBytes does not change it).
func (c *Client) Sharing() rpc.Sharing { return c.sharing }

// StagingDir returns the folder, on this side, where the client writes the
// values it sends by reference ("" in bytes mode). The node deletes what
// is left there longer than StagingTTL.
func (c *Client) StagingDir() string {
	if !c.ref {
		return ""
	}
	return filepath.Join(c.dir, stagingDir)
}

func (c *Client) nextReq() reqID { return reqID{Client: c.client, Seq: c.seq.Add(1)} }

// isClosed reports whether Close was called: every call fails with
// ErrClosed from then on, as a closed Store's do.
func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// sendValue sets v to td, staged as a prefix when the value goes by
// reference, and runs send, a call of method (retried), with it. A staged
// prefix the node did not take is removed.
func (c *Client) sendValue(ctx context.Context, method string, td *tensordict.TensorDict, asPrefix bool, v *valueMsg, send func() error) error {
	vs := []valueMsg{{}}
	return c.sendValues(ctx, method, []*tensordict.TensorDict{td}, asPrefix, vs, func() error {
		*v = vs[0]
		return send()
	})
}

// sendValues is sendValue for several values: vs[i] is set to tds[i]
// before send runs, and every staged prefix is staged anew when an attempt
// was cut off and the node no longer finds one of them.
func (c *Client) sendValues(ctx context.Context, method string, tds []*tensordict.TensorDict, asPrefix bool, vs []valueMsg, send func() error) error {
	staged := make([]bool, len(tds))
	anyStaged := false
	for i, td := range tds {
		if td == nil {
			return errorf(ErrFormat, "no TensorDict")
		}
		size := valueBytes(td)
		if size > c.info.MaxValueBytes {
			return errorf(ErrTooLarge, "a value of %d bytes; the store takes at most %d", size, c.info.MaxValueBytes)
		}
		staged[i] = c.ref && (asPrefix || size >= c.info.InlineBytes)
		anyStaged = anyStaged || staged[i]
	}
	dirs := make([]string, len(tds))
	discard := func() {
		for i, dir := range dirs {
			if dir != "" {
				discardStaged(dir) // the node may be taking it still
				dirs[i] = ""
			}
		}
	}
	stage := func() error {
		discard()
		for i, td := range tds {
			if !staged[i] {
				continue
			}
			name := newStagedName()
			dir := filepath.Join(c.dir, stagingDir, name)
			if err := writePrefix(td, dir, c.info.NoSync); err != nil {
				os.RemoveAll(dir)
				discard()
				if errors.Is(err, tensordict.ErrKey) {
					return errorf(ErrFormat, "%v", err)
				}
				return fmt.Errorf("store: staging a value: %w", err)
			}
			dirs[i] = dir
			vs[i] = valueMsg{Staged: stagingDir + "/" + name}
		}
		return nil
	}
	for i, td := range tds {
		if !staged[i] {
			vs[i] = valueMsg{TD: &rpc.TD{TensorDict: td}}
		}
	}
	if anyStaged {
		if err := stage(); err != nil {
			return err
		}
	}
	cut := false // an attempt was cut off: the node may have taken a prefix and lost it
	err := c.calls.Retry(ctx, method, func() error {
		err := send()
		if anyStaged && cut && errors.Is(err, ErrNotStaged) {
			if err := stage(); err != nil {
				return err
			}
			err = send()
		}
		if errors.Is(err, rpc.ErrUnavailable) {
			cut = true
		}
		return err
	})
	if err != nil {
		discard()
	}
	return err
}

// discardStaged removes this side's staged prefix at dir, which the node
// may be taking at that very moment (a call given up on: its context
// ended, the connection broke). It claims the folder first by renaming it
// to a fresh staged name: the rename fails when the node took it (the
// value is the node's, whole), or leaves it to this side alone. A client
// that dies between the two leaves a staged prefix the node's sweep
// removes after StagingTTL. os.RemoveAll alone deletes the files through
// the folder's descriptor, and a rename by the node in the middle moved
// a folder whose files it went on deleting: the bin held a value without
// its meta.json, and every Get of it failed (faulttest's
// TestStoreAcrossHosts, 1 run in 60 here, once in CI).
func discardStaged(dir string) {
	claimed := filepath.Join(filepath.Dir(dir), newStagedName())
	if err := os.Rename(dir, claimed); err != nil {
		return // taken by the node, or never there
	}
	os.RemoveAll(claimed)
}

// Put replaces the bin's content with td, as its one item, and returns the
// store's revision after it (Store.Put).
func (c *Client) Put(ctx context.Context, bin string, td *tensordict.TensorDict) (uint64, error) {
	return c.store(ctx, MethodPut, bin, td)
}

// Append adds td to the bin as its last item and returns the store's
// revision after it (Store.Append).
func (c *Client) Append(ctx context.Context, bin string, td *tensordict.TensorDict) (uint64, error) {
	return c.store(ctx, MethodAppend, bin, td)
}

func (c *Client) store(ctx context.Context, method, bin string, td *tensordict.TensorDict) (uint64, error) {
	if err := CheckName(bin); err != nil {
		return 0, err
	}
	req := putRequest{Store: c.name, Bin: bin, Req: c.nextReq()}
	var resp revResponse
	err := c.sendValue(ctx, method, td, false, &req.Value, func() (err error) {
		resp, err = rpc.Call[revResponse](ctx, c.rc, method, req)
		return err
	})
	return resp.Rev, err
}

// Get returns the bin's items, oldest first, and removes them, as
// Store.Get does. It takes two calls: the first returns the items and has
// the node hold them; the second, made once this side has them all (mapped
// or received), removes them. Items whose removal is never acknowledged
// (this process died, the connection stayed down) go back to the bin
// after the node's GetTimeout, so a failed Get loses nothing; a Get that
// returns them removed them exactly once. Close every item when done.
//
// ctx bounds the wait for items. Once this side has them, their removal is
// acknowledged even if ctx ends meanwhile (for at most ackWait), and Get
// returns them: an item removed is an item the caller holds. A Get that
// fails after the node may have held items for it (ctx ended during the
// first call, the acknowledgement failed) gives them back at once rather
// than after GetTimeout, best effort, so a caller that Gets again sees
// them.
func (c *Client) Get(ctx context.Context, bin string) ([]*tensordict.TensorDict, error) {
	if err := CheckName(bin); err != nil {
		return nil, err
	}
	for {
		id := random64()
		resp, err := service.Call[takeResponse](ctx, &c.calls, MethodTake, takeRequest{Store: c.name, Bin: bin, Take: id, Refs: c.ref})
		if err != nil {
			if ctx.Err() != nil {
				// The node may have held items for this take before ctx
				// ended the wait for its reply.
				c.giveBack(id)
			}
			return nil, err
		}
		if resp.Take == 0 {
			return nil, nil
		}
		tds, err := c.items(resp.Items)
		if err != nil {
			c.giveBack(id)
			return nil, err
		}
		if testAfterTake != nil {
			testAfterTake()
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackWait)
		_, err = service.Call[revResponse](actx, &c.calls, MethodAck, ackRequest{Store: c.name, Take: id})
		cancel()
		if err == nil {
			return tds, nil
		}
		closeAll(tds)
		if !errors.Is(err, ErrExpired) {
			c.giveBack(id)
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// The bin changed under the Get, or it was held too long: again.
	}
}

// ackWait bounds a Get's acknowledgement of items it already has, which
// does not end with the caller's context.
const ackWait = 30 * time.Second

// testAfterTake, when set by a test, runs between a Get's two calls;
// testBeforeMap before an item by reference is mapped.
var testAfterTake, testBeforeMap func()

// giveBack tells the node to give a Get's items back at once, without
// waiting for the Get to expire; best effort.
func (c *Client) giveBack(id uint64) {
	ctx, cancel := context.WithTimeout(c.bg, 5*time.Second)
	defer cancel()
	rpc.Call[revResponse](ctx, c.rc, MethodAck, ackRequest{Store: c.name, Take: id, Drop: true})
}

func closeAll(tds []*tensordict.TensorDict) {
	for _, td := range tds {
		td.Close()
	}
}

// items turns the node's items into TensorDicts: bytes as they came,
// paths mapped read-only. A path that is gone (the value was deleted
// after the node answered) is fs.ErrNotExist.
func (c *Client) items(msgs []itemMsg) ([]*tensordict.TensorDict, error) {
	out := make([]*tensordict.TensorDict, 0, len(msgs))
	for _, m := range msgs {
		var td *tensordict.TensorDict
		switch {
		case m.Path != "":
			if !c.ref || !validValuePath(m.Path) {
				closeAll(out)
				return nil, fmt.Errorf("store: the node sent the path %q", m.Path)
			}
			if testBeforeMap != nil {
				testBeforeMap()
			}
			dir := filepath.Join(c.dir, filepath.FromSlash(m.Path))
			var err error
			td, err = tensordict.LoadMemmap(dir, tensordict.ReadOnly())
			if err != nil {
				closeAll(out)
				if _, serr := os.Lstat(dir); errors.Is(serr, fs.ErrNotExist) {
					// LoadMemmap says only that meta.json is missing.
					return nil, fmt.Errorf("store: mapping a value: %s is gone: %w", m.Path, fs.ErrNotExist)
				}
				return nil, fmt.Errorf("store: mapping a value: %w", err)
			}
			if c.sharing < rpc.Coherent {
				// Another page cache (another host, over NFS): the node
				// unlinks the prefix TrashGrace after the item leaves the
				// bin, and a mapping here faults at its next page then.
				// The caller keeps the items as long as it likes: copy.
				mapped := td
				td, err = mapped.Clone()
				mapped.Close()
				if err != nil {
					closeAll(out)
					return nil, fmt.Errorf("store: reading a value at %s: %w", m.Path, err)
				}
			}
		case m.TD != nil && m.TD.TensorDict != nil:
			td = m.TD.TensorDict
		default:
			closeAll(out)
			return nil, fmt.Errorf("store: the node sent an item without a value")
		}
		out = append(out, td)
	}
	return out, nil
}

// Peek returns the bin's items, oldest first, and keeps them (Store.Peek).
// Close every item when done.
func (c *Client) Peek(ctx context.Context, bin string) ([]*tensordict.TensorDict, error) {
	if err := CheckName(bin); err != nil {
		return nil, err
	}
	for {
		resp, err := service.Call[takeResponse](ctx, &c.calls, MethodTake, takeRequest{Store: c.name, Bin: bin, Refs: c.ref})
		if err != nil {
			return nil, err
		}
		tds, err := c.items(resp.Items)
		if errors.Is(err, fs.ErrNotExist) && ctx.Err() == nil {
			continue // a Get removed an item meanwhile: peek again
		}
		return tds, err
	}
}

// List returns the number of items in each bin that has any, and the
// revision the counts are at (Store.List).
func (c *Client) List(ctx context.Context) (map[string]int, uint64, error) {
	resp, err := service.Call[listResponse](ctx, &c.calls, MethodList, storeRequest{Store: c.name})
	if resp.Bins == nil && err == nil {
		resp.Bins = map[string]int{}
	}
	return resp.Bins, resp.Rev, err
}

// Delete removes the bin and its items (Store.Delete).
func (c *Client) Delete(ctx context.Context, bin string) (uint64, error) {
	if err := CheckName(bin); err != nil {
		return 0, err
	}
	resp, err := service.Call[revResponse](ctx, &c.calls, MethodDelete, deleteRequest{Store: c.name, Bin: bin, Req: c.nextReq()})
	return resp.Rev, err
}

// Publish stores td as the next version of the parameter set name and
// returns its number (Store.Publish). By reference, td is written once,
// into a prefix in the store's staging folder, which the node renames into
// place: readers sharing the filesystem map that prefix.
func (c *Client) Publish(ctx context.Context, name string, td *tensordict.TensorDict) (uint64, error) {
	if err := CheckName(name); err != nil {
		return 0, err
	}
	req := publishRequest{Store: c.name, Name: name, Req: c.nextReq()}
	var resp publishResponse
	err := c.sendValue(ctx, MethodPublish, td, true, &req.Value, func() (err error) {
		resp, err = rpc.Call[publishResponse](ctx, c.rc, MethodPublish, req)
		return err
	})
	return resp.Version, err
}

// Latest returns the latest version of the parameter set name
// (Store.Latest). By reference, its TD maps the version's prefix
// read-only, and the client renews its lease in the background until the
// Param is closed; by bytes, its TD is a copy the client received.
// ErrNotFound if none was published.
func (c *Client) Latest(ctx context.Context, name string) (*Param, error) {
	return c.read(ctx, name, 0, false, nil)
}

// WaitNewer returns the latest version of name once it is newer than v,
// waiting for its publication if need be, until ctx ends
// (Store.WaitNewer).
func (c *Client) WaitNewer(ctx context.Context, name string, v uint64) (*Param, error) {
	return c.read(ctx, name, v, true, nil)
}

// LatestInto is Latest that, by bytes, reads the version into buf instead
// of new memory when its layout is buf's: the same tensor keys, dtypes and
// shapes, and no non-tensor data (rpc.CallInto). A worker that follows a
// parameter set then allocates it once, as a loop reading into one buffer
// from a socket does. The Param's TD is buf when it was read into it (valid
// as long as buf is; Close releases nothing of it), a copy in new memory
// when the layout differs, and the read-only mapping when the version
// comes by reference. buf must not be used by anything else during the
// call; when the call fails, it may hold part of the version.
func (c *Client) LatestInto(ctx context.Context, name string, buf *tensordict.TensorDict) (*Param, error) {
	return c.read(ctx, name, 0, false, buf)
}

// WaitNewerInto is WaitNewer reading into buf as LatestInto does.
func (c *Client) WaitNewerInto(ctx context.Context, name string, v uint64, buf *tensordict.TensorDict) (*Param, error) {
	return c.read(ctx, name, v, true, buf)
}

// read is Latest (wait false) and WaitNewer, by bytes into buf where it
// fits (nil: none).
func (c *Client) read(ctx context.Context, name string, after uint64, wait bool, buf *tensordict.TensorDict) (*Param, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	var into []*tensordict.TensorDict
	if buf != nil {
		into = append(into, buf) // used only if the version comes as bytes
	}
	resp, err := service.Call[readResponse](ctx, &c.calls, MethodRead, readRequest{Store: c.name, Name: name, After: after, Wait: wait, Refs: c.ref}, into...)
	if err != nil {
		return nil, err
	}
	if resp.Path == "" {
		c.releaseAsync(resp.Lease) // the bytes are here
		if resp.TD == nil || resp.TD.TensorDict == nil {
			return nil, fmt.Errorf("store: the node sent no parameters")
		}
		return &Param{Name: name, Version: resp.Version, TD: resp.TD.TensorDict}, nil
	}
	if !c.ref || !validValuePath(resp.Path) {
		c.releaseAsync(resp.Lease)
		return nil, fmt.Errorf("store: the node sent the path %q", resp.Path)
	}
	td, err := tensordict.LoadMemmap(filepath.Join(c.dir, filepath.FromSlash(resp.Path)), tensordict.ReadOnly())
	if err != nil {
		c.releaseAsync(resp.Lease)
		return nil, fmt.Errorf("store: mapping parameters %q version %d: %w", name, resp.Version, err)
	}
	p := &Param{Name: name, Version: resp.Version, TD: td}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		td.Close()
		return nil, ErrClosed
	}
	c.leases[resp.Lease] = &heldLease{ref: leaseRef{ID: resp.Lease, Name: name, Version: resp.Version}, p: p}
	c.mu.Unlock()
	p.release = func() error {
		c.mu.Lock()
		delete(c.leases, resp.Lease)
		c.mu.Unlock()
		err := td.Close()
		c.releaseAsync(resp.Lease)
		return err
	}
	return p, nil
}

// releaseAsync ends a lease without waiting; one the node never hears of
// expires.
func (c *Client) releaseAsync(id uint64) {
	if id == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(c.bg, 5*time.Second)
	f := rpc.Go[rpc.Empty](ctx, c.rc, MethodRelease, releaseRequest{Store: c.name, Leases: []uint64{id}})
	go func() {
		f.Wait()
		cancel()
	}()
}

// renewLoop renews the leases of the Params this client holds, every third
// of the node's lease time, until Close.
func (c *Client) renewLoop() {
	defer c.wg.Done()
	every := max(time.Duration(c.info.LeaseMS)*time.Millisecond/3, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.bg.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		var refs []leaseRef
		for _, l := range c.leases {
			refs = append(refs, l.ref)
		}
		c.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(c.bg, every)
		resp, err := rpc.Call[renewResponse](ctx, c.rc, MethodRenew, renewRequest{Store: c.name, Leases: refs})
		cancel()
		if err != nil {
			continue // the node is away: try again next time
		}
		c.mu.Lock()
		for _, id := range resp.Lost {
			if l := c.leases[id]; l != nil {
				l.p.setLost(errorf(ErrExpired, "the lease on %q version %d ran out and the version was deleted", l.ref.Name, l.ref.Version))
				delete(c.leases, id)
			}
		}
		c.mu.Unlock()
	}
}

// Watch returns the store's events whose names start with prefix, after
// revision after (FromNow: from now on), as Store.Watch does. They come
// on a message stream of this client's own connection, pushed by the node
// as they become durable (so no port needs to be open on this side); a
// watch cut off by the node restarting or the network failing resumes,
// with backoff, from the last revision the node said it had looked up to,
// or yields ErrCompacted if the node no longer keeps it.
func (c *Client) Watch(ctx context.Context, prefix string, after uint64) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		if err := checkPrefix(prefix); err != nil {
			yield(Event{}, err)
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wait := service.Backoff()
		for {
			st, err := rpc.OpenStream[rpc.Empty, watchMessage](wctx, c.rc, MethodWatch,
				watchRequest{Store: c.name, ID: c.info.ID, Prefix: prefix, After: after})
			for err == nil {
				var m watchMessage
				if m, err = st.Recv(wctx); err != nil {
					break
				}
				wait.Reset() // the stream works: back off afresh next time
				for _, e := range m.Events {
					if !yield(e, nil) {
						st.Close()
						return
					}
				}
				after = m.Seen
			}
			if st != nil {
				st.Close()
			}
			// FromNow is resolved by the node once: a stream that failed
			// before telling where "now" was starts from now again.
			switch {
			case ctx.Err() != nil:
				err = ctx.Err()
			case c.isClosed() || errors.Is(err, rpc.ErrClosed):
				err = ErrClosed
			case c.calls.Retryable(MethodWatch, err):
				if err = wait.Wait(ctx); err == nil {
					continue
				}
			}
			yield(Event{}, err)
			return
		}
	}
}

// Stats returns the store's figures (Store.Stats).
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return service.Call[Stats](ctx, &c.calls, MethodStats, storeRequest{Store: c.name})
}

// Close closes the connection; calls in flight and later ones fail with
// ErrClosed (as a closed Store's do), watches end with it. Params still open
// stop being renewed, and their versions may be deleted once their leases
// run out.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.stop()
	c.wg.Wait()
	return c.rc.Close()
}
