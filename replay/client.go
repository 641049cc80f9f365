package replay

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/backoff"
	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Client is a buffer served by a node (Service), used from another process
// or machine with the same calls as a local Buffer.
//
// When the client and the node share a filesystem (the client's root,
// WithRoot, has the node root's identity) and the buffer lives under it,
// no transition bytes cross the network: Extend reserves slots, writes the
// rows into its own mapping of the storage and commits them; Sample gets
// indices and generations from the node and gathers the rows from its own
// mapping, checking each row's generation afterwards so that a row a writer
// overwrote meanwhile is sampled again rather than returned torn. Otherwise
// the rows travel with the calls. SharedFS says which.
//
// Calls ride out the node restarting: a call that finds the node
// unreachable is tried again, with backoff, until its context ends, and
// Extend never adds a batch twice (a commit retried after a lost reply is
// recognised). A Client is safe for concurrent use; Close it when done.
type Client struct {
	rc      *rpc.Client
	calls   service.Caller // rc's calls, tried again while the node is unreachable
	name    string
	o       dialOptions
	bytes   bool        // rows travel as bytes; set by Dial
	sharing rpc.Sharing // the connection's at Dial

	mu     sync.Mutex
	closed bool  // set by Close: every call fails with ErrClosed from then on
	cur    *view // the buffer as last described; nil once closed

	// views counts the calls holding a view (acquire to release): Close
	// waits for them, so it returns with every mapping unmapped.
	views sync.WaitGroup

	bg       context.Context // ends at Close: the context of prefetches
	stop     context.CancelFunc
	pfMu     sync.Mutex
	prefetch *prefetched // the next sample's picks, asked for ahead (WithPrefetch)

	slMu   sync.Mutex
	slLeft slicesLeft // slices asked for ahead (WithSlicesAhead)
}

// view is the buffer as the node described it (replay.info) and, by
// reference, this side's mapping of its storage and slot table. A view
// never changes: when the node describes another buffer under the name (it
// was created anew) or the schema becomes known, a new view replaces the
// current one (swap). refs counts the calls using a view, plus one while it
// is current; the last release unmaps it, so no call ever sees its
// mapping go (as rpc/refs.go keeps the node's cached mappings).
type view struct {
	id          string
	schema      tensordict.RowSchema // per transition; nil until the first batch
	lease       time.Duration
	writer      Writer                 // a top-k writer needs each transition's key
	resampleAll bool                   // rows found overwritten: pick the whole sample again
	storage     *tensordict.TensorDict // by reference, once the schema is known; else nil
	slots       *slotTable             // with storage
	refs        int                    // guarded by Client.mu
}

// unmap closes the view's mappings; its last user has released it.
func (v *view) unmap() {
	if v.storage != nil {
		v.storage.Close()
	}
	if v.slots != nil {
		v.slots.close()
	}
}

// prefetched is a sample call made ahead of the SampleInto that will use
// it.
type prefetched struct {
	n int
	f *rpc.Future[sampleResponse]
}

// DialOption configures Dial.
type DialOption func(*dialOptions)

type dialOptions struct {
	service.Dialing // root, bytes, rpc's options
	prefetch        bool
	slicesAhead     int // WithSlicesAhead; 0 or 1: none
}

// WithRoot sets this side's view of the shared root (rpc.WithRoot), which
// lets the client work on the buffer's storage by reference when the node
// shares it.
func WithRoot(dir string) DialOption { return func(o *dialOptions) { o.Root = dir } }

// WithBytes makes the rows travel as bytes even when the filesystem is
// shared.
func WithBytes() DialOption { return func(o *dialOptions) { o.Bytes = true } }

// WithPrefetch has a client working by reference ask the node for the
// next sample's picks while it gathers the rows of this one, so the call's
// round trip overlaps the copy (torchrl's prefetch, one batch deep). The
// picks are made, and counted by the rate limiter, one sample early; rows
// overwritten in between are caught by the generation check and sampled
// again, as always. It helps a trainer that samples batches of one size in
// a loop; calls of another size discard the prefetched picks.
func WithPrefetch() DialOption { return func(o *dialOptions) { o.prefetch = true } }

// WithSlicesAhead has a client working by reference ask the node, in one
// SampleSlices call, for the slices of k samples (Reverb's samples in
// flight per worker), and serve the next k-1 calls with the same
// SliceSpec from them: k round trips become one. The picks of all k are
// made, and counted by the rate limiter (and max_times_sampled, and an
// epoch without replacement), when they are asked for; steps written in
// between are picked from the next call to the node on, and a priority
// updated in between applies from then; a slice with a step overwritten
// or deleted since is caught by the word check and sampled again, as
// always. A call with another SliceSpec drops the slices left, as Close
// does: they were counted as sampled all the same (and, without
// replacement, spent from their epoch). Two calls that find none left at
// once both ask the node; the later one's are kept. k is cut so that the
// k samples' steps fit one call (maxSample); by bytes it does nothing.
func WithSlicesAhead(k int) DialOption { return func(o *dialOptions) { o.slicesAhead = k } }

// WithRPC passes options to rpc.Dial: a token, TLS, a logger, limits.
func WithRPC(opts ...rpc.Option) DialOption {
	return func(o *dialOptions) { o.RPC = append(o.RPC, opts...) }
}

// Dial connects to the buffer served as name by the node at addr.
// ErrNotFound if the node serves no buffer of that name.
func Dial(ctx context.Context, addr, name string, opts ...DialOption) (*Client, error) {
	var o dialOptions
	for _, opt := range opts {
		opt(&o)
	}
	rc, err := o.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	c := &Client{rc: rc, name: name, o: o}
	c.calls = service.Caller{RPC: rc, Methods: repeatable, Closed: c.isClosed, ErrClosed: ErrClosed}
	c.bg, c.stop = context.WithCancel(context.Background())
	info, err := c.info(ctx)
	if err != nil {
		c.stop()
		rc.Close()
		return nil, err
	}
	// Rows are written in place: references need one page cache
	// (rpc.Coherent), not only the same files.
	var shared bool
	if c.sharing, shared, err = o.Mode(ctx, rc, info.Prefix != "", rpc.Coherent); err != nil {
		c.stop()
		rc.Close()
		return nil, err
	}
	c.bytes = !shared
	if c.cur, err = c.newView(info); err != nil {
		c.stop()
		rc.Close()
		return nil, err
	}
	c.cur.refs = 1 // the Client's own, until swap or Close
	return c, nil
}

// SharedFS reports whether the client works by reference: true when the
// rows stay in the storage it shares with the node (its root has the node
// root's identity, the buffer lives under it, and WithBytes was not
// given), false when they travel with the calls. It is fixed at Dial, as
// rpc.Client.SharedFS is for the connection.
func (c *Client) SharedFS() bool { return !c.bytes }

// Sharing returns how much of the node's root the client shared at Dial
// (rpc.None without a root; WithBytes does not change it). References need
// rpc.Coherent: at rpc.Storage (another machine on the same files, another
// page cache) the rows travel as bytes.
func (c *Client) Sharing() rpc.Sharing { return c.sharing }

func (c *Client) info(ctx context.Context) (infoResponse, error) {
	return service.Call[infoResponse](ctx, &c.calls, MethodInfo, infoRequest{Name: c.name})
}

// newView makes a view of the buffer info describes: by reference, once
// its schema is known, with mappings of its storage and slot table.
func (c *Client) newView(info infoResponse) (*view, error) {
	schema := info.Schema
	if schema != nil {
		if err := schema.Validate(); err != nil {
			return nil, fmt.Errorf("replay: the node describes the buffer's schema badly: %w", err)
		}
	}
	v := &view{
		id: info.ID, schema: schema, lease: time.Duration(info.LeaseMS) * time.Millisecond,
		writer: Writer{info.Writer}, resampleAll: info.ResampleAll,
	}
	if c.bytes || schema == nil {
		return v, nil
	}
	prefix := filepath.Join(c.o.Root, filepath.FromSlash(info.Prefix))
	var err error
	// The client writes rows into the storage and words into the slot
	// table: neither is reached through a link out of the buffer's folder.
	if err := refuseLinks(prefix, ErrConfig); err != nil {
		return nil, fmt.Errorf("replay: mapping the shared storage: %w", err)
	}
	if v.storage, err = loadInFolder(prefix, filepath.Join(prefix, StorageDir)); err != nil {
		return nil, fmt.Errorf("replay: mapping the shared storage: %w", err)
	}
	v.storage.InPlace() // a writer's rows, lap after lap: through the mapping
	if v.slots, err = openSlots(filepath.Join(prefix, SlotsFile), info.Capacity); err != nil {
		v.storage.Close()
		return nil, fmt.Errorf("replay: mapping the slot table: %w", err)
	}
	return v, nil
}

// ready reports whether v has all a call needs: the schema and, by
// reference, the mappings.
func (c *Client) ready(v *view) bool {
	return v.schema != nil && (c.bytes || v.storage != nil)
}

// acquire returns the current view, held until release; ErrClosed once c
// is closed.
func (c *Client) acquire() (*view, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	c.cur.refs++
	c.views.Add(1)
	return c.cur, nil
}

// release ends a call's use of v, and unmaps v if it was the last use of
// a view no longer current.
func (c *Client) release(v *view) {
	c.mu.Lock()
	v.refs--
	last := v.refs == 0
	c.mu.Unlock()
	if last {
		v.unmap()
	}
	c.views.Done()
}

// swap makes v the current view (with the reference the Client holds on
// it); the old one is unmapped once no call uses it. ErrClosed, and v
// unmapped, once c is closed.
func (c *Client) swap(v *view) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		v.unmap()
		return ErrClosed
	}
	old := c.cur
	v.refs = 1
	c.cur = v
	old.refs--
	last := old.refs == 0
	c.mu.Unlock()
	if last {
		old.unmap()
	}
	return nil
}

// refresh asks the node for the buffer's description and makes it the
// current view, unless the current one already describes that buffer
// completely.
func (c *Client) refresh(ctx context.Context) error {
	info, err := c.info(ctx)
	if err != nil {
		return err
	}
	cur, err := c.acquire()
	if err != nil {
		return err
	}
	same := cur.id == info.ID && c.ready(cur)
	c.release(cur)
	if same {
		return nil
	}
	v, err := c.newView(info)
	if err != nil {
		return err
	}
	return c.swap(v)
}

// viewOf returns the view of the buffer whose id is id, with its mappings,
// held until release: the current one, or a new one if the node's
// description says more (a buffer created anew, its schema now known).
// ErrExpired if the node now serves another buffer under the name: the
// reservation or the picks made in buffer id went with it.
func (c *Client) viewOf(ctx context.Context, id string) (*view, error) {
	for refreshed := false; ; refreshed = true {
		v, err := c.acquire()
		if err != nil {
			return nil, err
		}
		if v.id == id && c.ready(v) {
			return v, nil
		}
		now := v.id
		c.release(v)
		switch {
		case refreshed && now != id:
			return nil, fmt.Errorf("%w: the buffer was created anew (id %s, now %s)", ErrExpired, id, now)
		case refreshed:
			return nil, fmt.Errorf("replay: the node describes buffer %s without its schema", id)
		}
		if err := c.refresh(ctx); err != nil {
			return nil, err
		}
	}
}

// Extend adds a batch of transitions and returns the slot each went to, as
// Buffer.Extend does. By reference the rows are written straight into the
// shared storage; a reservation whose lease runs out before they are (the
// process stalled) is abandoned and the batch extended again.
func (c *Client) Extend(ctx context.Context, td *tensordict.TensorDict) ([]int, error) {
	return c.ExtendPriority(ctx, td, nil)
}

// ExtendPriority is Extend with a priority for each transition (nil: the
// largest seen so far).
func (c *Client) ExtendPriority(ctx context.Context, td *tensordict.TensorDict, priorities []float64) ([]int, error) {
	v, err := c.acquire()
	if err != nil {
		return nil, err
	}
	w := v.writer
	c.release(v)
	n, keys, err := checkExtend(td, priorities, w)
	if err != nil {
		return nil, err
	}
	req := reserveRequest{Name: c.name, Schema: td.RowSchema(), N: n, Keys: keys}
	for {
		idx, err := c.extendOnce(ctx, req, td, priorities)
		if !errors.Is(err, ErrExpired) {
			return idx, err
		}
		if ctx.Err() != nil {
			return nil, err
		}
	}
}

// extendOnce reserves, writes and commits once; ErrExpired means the batch
// was not added and can be extended again.
func (c *Client) extendOnce(ctx context.Context, req reserveRequest, td *tensordict.TensorDict, priorities []float64) ([]int, error) {
	sent := time.Now()
	r, err := service.Call[reserveResponse](ctx, &c.calls, MethodReserve, req)
	if err != nil {
		return nil, err
	}
	if len(r.Slots) != req.N {
		return nil, fmt.Errorf("replay: the node reserved %d slots for %d transitions", len(r.Slots), req.N)
	}
	commit := commitRequest{Name: c.name, RID: r.RID, Slots: r.Slots, Priorities: priorities}
	if c.bytes {
		commit.Batch = &rpc.TD{TensorDict: td}
	} else {
		v, err := c.viewOf(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		// The node expires the reservation a lease after it made it; this
		// side counts from before it asked, and keeps an eighth of the
		// lease in hand. The copy starts only before this deadline, so it
		// would have to stall for that eighth to write into a slot the
		// node has handed to another writer.
		deadline := sent.Add(v.lease - v.lease/8)
		err = writeRowsBefore(v.storage, r.Slots, td, deadline)
		c.release(v)
		if err != nil {
			return nil, err
		}
	}
	resp, err := service.Call[commitResponse](ctx, &c.calls, MethodCommit, commit)
	return resp.Indices, err
}

// writeRowsBefore is writeRows, started only before deadline. It fails
// with ErrExpired if deadline has passed before the copy, or by the time it
// ends: then the rows may have landed late, and the reservation is not
// committed.
func writeRowsBefore(storage *tensordict.TensorDict, slots []int, td *tensordict.TensorDict, deadline time.Time) error {
	if time.Now().After(deadline) {
		return fmt.Errorf("%w: the lease ran out before the rows were written", ErrExpired)
	}
	if err := writeRows(storage, slots, td); err != nil {
		return err
	}
	if time.Now().After(deadline) {
		return fmt.Errorf("%w: the lease ran out while the rows were written", ErrExpired)
	}
	return nil
}

// Sample returns n transitions chosen by the buffer's sampler, as
// Buffer.Sample does.
func (c *Client) Sample(ctx context.Context, n int) (*tensordict.TensorDict, SampleInfo, error) {
	if err := checkSampleSize(n); err != nil {
		return nil, SampleInfo{}, rpc.Errorf(rpc.CodeOf(err), "%w", err) // as the node would say it
	}
	if c.bytes {
		return c.sampleBytes(ctx, n, nil)
	}
	schema, err := c.knownSchema(ctx)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	return sampleNew(ctx, schema, n, c.SampleInto)
}

// sampleBytes has the node sample n transitions and send their rows, read
// into into where its layout is theirs (rpc.CallInto; nil: a new batch).
// The batch returned is into only if they were.
func (c *Client) sampleBytes(ctx context.Context, n int, into *tensordict.TensorDict) (*tensordict.TensorDict, SampleInfo, error) {
	resp, err := c.sampleCall(ctx, n, true, into)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	if resp.Batch == nil || resp.Batch.TensorDict == nil {
		return nil, SampleInfo{}, fmt.Errorf("replay: the node sent no rows")
	}
	return resp.Batch.TensorDict, resp.Info, nil
}

// knownSchema returns the buffer's schema, asking the node until it has one
// (its first batch) or ctx ends, with backoff from 10 ms to 1 s.
func (c *Client) knownSchema(ctx context.Context) (tensordict.RowSchema, error) {
	wait := backoff.Backoff{Base: 10 * time.Millisecond, Max: time.Second}
	for {
		v, err := c.acquire()
		if err != nil {
			return nil, err
		}
		schema := v.schema
		c.release(v)
		if schema != nil {
			return schema, nil
		}
		info, err := c.info(ctx)
		if err != nil {
			return nil, err
		}
		if info.Schema != nil {
			v, err := c.newView(info)
			if err != nil {
				return nil, err
			}
			if err := c.swap(v); err != nil {
				return nil, err
			}
			continue
		}
		if err := wait.Wait(ctx); err != nil {
			return nil, err
		}
	}
}

// SampleInto is Sample into dst, a TensorDict with the buffer's schema and
// batch size [n], without allocating it.
func (c *Client) SampleInto(ctx context.Context, dst *tensordict.TensorDict) (SampleInfo, error) {
	n, err := batchLen(dst)
	if err != nil {
		return SampleInfo{}, err
	}
	if c.bytes {
		// The rows are read from the connection straight into dst where
		// its layout is the batch's (rpc.CallInto); else copied in.
		td, info, err := c.sampleBytes(ctx, n, dst)
		if err != nil {
			return SampleInfo{}, err
		}
		if err := copyIn(dst, td); err != nil {
			return SampleInfo{}, err
		}
		return info, nil
	}
	resp, err := c.pick(ctx, n)
	if err != nil {
		return SampleInfo{}, err
	}
	if c.o.prefetch {
		c.startPrefetch(n)
	}
	v, err := c.viewOf(ctx, resp.ID)
	if err != nil {
		return SampleInfo{}, err
	}
	defer c.release(v)
	storage, slots := v.storage, v.slots
	info := resp.Info
	if err := checkPicks(info, n, slots.len()); err != nil {
		return SampleInfo{}, err
	}
	// Rows found overwritten are picked again: one for one, or the whole
	// sample where the node says so (replay.info's resample_all: a lifo or
	// heap sampler without MaxTimesSampled, whose pick of k would be the
	// first k again, already in the sample; Buffer.resampleAll).
	_, err = gatherChecked(storage, slots, dst, &info, v.resampleAll, func(k int) (SampleInfo, error) {
		more, err := c.sampleCall(ctx, k, false)
		if err == nil && more.ID != resp.ID {
			err = fmt.Errorf("%w: the buffer was created anew while sampled", ErrExpired)
		}
		if err == nil {
			err = checkPicks(more.Info, k, slots.len())
		}
		return more.Info, err
	})
	if err != nil {
		return SampleInfo{}, err
	}
	return info, nil
}

// copyIn copies td, a batch received by bytes, into dst unless it was
// read into dst already (rpc.CallInto).
func copyIn(dst, td *tensordict.TensorDict) error {
	if td == dst {
		return nil
	}
	return dst.SetSlice(0, td)
}

// checkPicks checks the node's picks for a sample of n from a buffer of
// capacity slots before they index this side's mappings.
func checkPicks(info SampleInfo, n, capacity int) error {
	if len(info.Indices) != n || len(info.IDs) != n || len(info.Weights) != n {
		return fmt.Errorf("replay: the node sampled %d rows for %d", len(info.Indices), n)
	}
	for _, s := range info.Indices {
		if s < 0 || s >= capacity {
			return fmt.Errorf("replay: the node sampled slot %d of %d", s, capacity)
		}
	}
	return nil
}

// pick returns the node's picks for a sample of n by reference: the
// prefetched ones if there are (WithPrefetch), else from a call now.
func (c *Client) pick(ctx context.Context, n int) (sampleResponse, error) {
	c.pfMu.Lock()
	p := c.prefetch
	c.prefetch = nil
	c.pfMu.Unlock()
	if p != nil && p.n == n {
		select {
		case <-p.f.Done():
			if resp, err := p.f.Wait(); err == nil {
				return resp, nil
			}
			// A failed prefetch (the node restarted, say): ask again.
		case <-ctx.Done():
			c.pfMu.Lock()
			if c.prefetch == nil {
				c.prefetch = p // for the next call
			}
			c.pfMu.Unlock()
			return sampleResponse{}, ctx.Err()
		}
	}
	return c.sampleCall(ctx, n, false)
}

// startPrefetch asks for the picks of the next sample of n, unless a
// prefetch is already out.
func (c *Client) startPrefetch(n int) {
	c.pfMu.Lock()
	defer c.pfMu.Unlock()
	if c.prefetch == nil && c.bg.Err() == nil {
		c.prefetch = &prefetched{n: n, f: rpc.Go[sampleResponse](c.bg, c.rc, MethodSample,
			sampleRequest{Name: c.name, N: n})}
	}
}

func (c *Client) sampleCall(ctx context.Context, n int, bytes bool, into ...*tensordict.TensorDict) (sampleResponse, error) {
	return service.Call[sampleResponse](ctx, &c.calls, MethodSample, sampleRequest{Name: c.name, N: n, Bytes: bytes}, into...)
}

// UpdatePriority sets the priorities of sampled transitions, as
// Buffer.UpdatePriority does.
func (c *Client) UpdatePriority(ctx context.Context, info SampleInfo, priorities []float64) (int, error) {
	resp, err := service.Call[updateResponse](ctx, &c.calls, MethodUpdatePriority,
		updateRequest{Name: c.name, Info: info, Priorities: priorities})
	return resp.Updated, err
}

// Checkpoint has the node checkpoint the buffer (Buffer.Checkpoint).
func (c *Client) Checkpoint(ctx context.Context) error {
	_, err := service.Call[rpc.Empty](ctx, &c.calls, MethodCheckpoint, nameRequest{Name: c.name})
	return err
}

// Stats returns the buffer's counters, and the Go heap of the node serving
// it (Stats.NodeHeap).
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return service.Call[Stats](ctx, &c.calls, MethodStats, nameRequest{Name: c.name})
}

// Close closes the connection, waits for the calls using the mappings to
// return (they fail with ErrClosed, or finish a copy under way) and
// unmaps them. Every call from then on returns ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	v := c.cur
	c.cur = nil
	v.refs--
	last := v.refs == 0
	c.mu.Unlock()
	if last {
		v.unmap()
	}
	c.stop()            // ends a prefetch
	err := c.rc.Close() // calls in flight fail now
	c.views.Wait()
	return err
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
