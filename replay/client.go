package replay

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

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
// the rows travel with the calls. Mode says which.
//
// Calls ride out the node restarting: a call that finds the node
// unreachable is tried again, with backoff, until its context ends, and
// Extend never adds a batch twice (a commit retried after a lost reply is
// recognised). A Client is safe for concurrent use; Close it when done.
type Client struct {
	rc    *rpc.Client
	name  string
	o     dialOptions
	bytes bool // rows travel as bytes

	use sync.RWMutex // calls using the mappings hold it shared; Close exclusively

	mu      sync.Mutex
	closed  bool
	id      string // the buffer's id when mapped
	lease   time.Duration
	writer  Writer // a top-k writer needs each transition's key
	schema  tensordict.RowSchema
	storage *tensordict.TensorDict // this side's mapping; nil in bytes mode or before the schema is known
	slots   *slotTable

	bg       context.Context // ends at Close: the context of prefetches
	stop     context.CancelFunc
	pfMu     sync.Mutex
	prefetch *prefetched // the next sample's picks, asked for ahead (WithPrefetch)
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
	root     string
	bytes    bool
	prefetch bool
	rpcOpts  []rpc.Option
}

// WithRoot sets this side's view of the shared root (rpc.WithRoot), which
// lets the client work on the buffer's storage by reference when the node
// shares it.
func WithRoot(dir string) DialOption { return func(o *dialOptions) { o.root = dir } }

// WithBytes makes the rows travel as bytes even when the filesystem is
// shared.
func WithBytes() DialOption { return func(o *dialOptions) { o.bytes = true } }

// WithPrefetch has a client working by reference ask the node for the
// next sample's picks while it gathers the rows of this one, so the call's
// round trip overlaps the copy (torchrl's prefetch, one batch deep). The
// picks are made, and counted by the rate limiter, one sample early; rows
// overwritten in between are caught by the generation check and sampled
// again, as always. It helps a trainer that samples batches of one size in
// a loop; calls of another size discard the prefetched picks.
func WithPrefetch() DialOption { return func(o *dialOptions) { o.prefetch = true } }

// WithRPC passes options to rpc.Dial: a token, TLS, a logger, limits.
func WithRPC(opts ...rpc.Option) DialOption {
	return func(o *dialOptions) { o.rpcOpts = append(o.rpcOpts, opts...) }
}

// Dial connects to the buffer served as name by the node at addr.
// ErrNotFound if the node serves no buffer of that name.
func Dial(ctx context.Context, addr, name string, opts ...DialOption) (*Client, error) {
	var o dialOptions
	for _, opt := range opts {
		opt(&o)
	}
	ropts := o.rpcOpts
	if o.root != "" {
		ropts = append(ropts, rpc.WithRoot(o.root))
	}
	rc, err := rpc.Dial(ctx, addr, ropts...)
	if err != nil {
		return nil, err
	}
	c := &Client{rc: rc, name: name, o: o}
	c.bg, c.stop = context.WithCancel(context.Background())
	info, err := c.info(ctx)
	if err != nil {
		c.stop()
		rc.Close()
		return nil, err
	}
	shared := false
	if o.root != "" && !o.bytes && info.Prefix != "" {
		if shared, err = rc.SharedFS(ctx); err != nil {
			c.stop()
			rc.Close()
			return nil, err
		}
	}
	c.bytes = !shared
	if err := c.adopt(info); err != nil {
		c.stop()
		rc.Close()
		return nil, err
	}
	return c, nil
}

// Mode returns "ref" when rows stay in the shared storage and "bytes" when
// they travel with the calls.
func (c *Client) Mode() string {
	if c.bytes {
		return "bytes"
	}
	return "ref"
}

func (c *Client) info(ctx context.Context) (infoResponse, error) {
	return call[infoResponse](ctx, c, MethodInfo, infoRequest{Name: c.name})
}

// adopt takes the buffer's description: its schema and, in ref mode, a
// mapping of its storage and slot table. A description of another buffer
// (the name's buffer was created anew) drops the mappings of the old one,
// so adopt runs with c.use held exclusively, or before any call (Dial).
func (c *Client) adopt(info infoResponse) error {
	schema := info.Schema
	if schema != nil {
		if err := schema.Validate(); err != nil {
			return fmt.Errorf("replay: the node describes the buffer's schema badly: %w", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if info.ID == c.id && (c.storage != nil || c.bytes) && c.schema != nil {
		return nil
	}
	if info.ID != c.id {
		c.unmapLocked()
	}
	c.id, c.schema = info.ID, schema
	c.lease, c.writer = time.Duration(info.LeaseMS)*time.Millisecond, info.Writer
	if c.bytes || schema == nil {
		return nil
	}
	prefix := filepath.Join(c.o.root, filepath.FromSlash(info.Prefix))
	storage, err := tensordict.LoadMemmap(filepath.Join(prefix, StorageDir))
	if err != nil {
		return fmt.Errorf("replay: mapping the shared storage: %w", err)
	}
	slots, err := openSlots(filepath.Join(prefix, SlotsFile), info.Capacity)
	if err != nil {
		storage.Close()
		return fmt.Errorf("replay: mapping the slot table: %w", err)
	}
	c.storage, c.slots = storage, slots
	return nil
}

// unmapLocked drops the mappings; c.mu is held, and c.use exclusively (Close,
// adopt).
func (c *Client) unmapLocked() {
	if c.storage != nil {
		c.storage.Close()
		c.storage = nil
	}
	if c.slots != nil {
		c.slots.close()
		c.slots = nil
	}
}

// refresh re-reads the buffer's description when a response carries an id
// other than the one mapped (the buffer was created anew, or its schema
// became known). It holds c.use exclusively while it remaps.
func (c *Client) refresh(ctx context.Context, id string) error {
	c.mu.Lock()
	ok := c.id == id && (c.bytes || c.storage != nil)
	c.mu.Unlock()
	if ok {
		return nil
	}
	info, err := c.info(ctx)
	if err != nil {
		return err
	}
	c.use.RUnlock()
	c.use.Lock()
	err = c.adopt(info)
	c.use.Unlock()
	c.use.RLock()
	return err
}

// mapping returns the current mappings (nil in bytes mode).
func (c *Client) mapping() (*tensordict.TensorDict, *slotTable, tensordict.RowSchema, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.storage, c.slots, c.schema, c.lease
}

func (c *Client) enter() error {
	c.use.RLock()
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		c.use.RUnlock()
		return ErrClosed
	}
	return nil
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
	c.mu.Lock()
	w := c.writer
	c.mu.Unlock()
	n, keys, err := checkExtend(td, priorities, w)
	if err != nil {
		return nil, err
	}
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.use.RUnlock()
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
	r, err := call[reserveResponse](ctx, c, MethodReserve, req)
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
		if err := c.refresh(ctx, r.ID); err != nil {
			return nil, err
		}
		storage, _, _, lease := c.mapping()
		if storage == nil {
			return nil, fmt.Errorf("replay: no mapping of the buffer's storage")
		}
		// The node expires the reservation a lease after it made it; this
		// side counts from before it asked, and keeps an eighth of the
		// lease in hand. The copy starts only before this deadline, so it
		// would have to stall for that eighth to write into a slot the
		// node has handed to another writer.
		deadline := sent.Add(lease - lease/8)
		if err := writeRowsBefore(storage, r.Slots, td, deadline); err != nil {
			return nil, err
		}
	}
	resp, err := call[commitResponse](ctx, c, MethodCommit, commit)
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
		if err := c.enter(); err != nil {
			return nil, SampleInfo{}, err
		}
		defer c.use.RUnlock()
		return c.sampleBytes(ctx, n)
	}
	schema, err := c.knownSchema(ctx)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	return sampleNew(ctx, schema, n, c.SampleInto)
}

// sampleBytes has the node sample n transitions and send their rows.
func (c *Client) sampleBytes(ctx context.Context, n int) (*tensordict.TensorDict, SampleInfo, error) {
	resp, err := c.sampleCall(ctx, n, true)
	if err != nil {
		return nil, SampleInfo{}, err
	}
	if resp.Batch == nil || resp.Batch.TensorDict == nil {
		return nil, SampleInfo{}, fmt.Errorf("replay: the node sent no rows")
	}
	return resp.Batch.TensorDict, resp.Info, nil
}

// knownSchema returns the buffer's schema, asking the node until it has one
// (its first batch) or ctx ends.
func (c *Client) knownSchema(ctx context.Context) (tensordict.RowSchema, error) {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if _, _, schema, _ := c.mapping(); schema != nil {
			return schema, nil
		}
		info, err := c.info(ctx)
		if err != nil {
			return nil, err
		}
		if info.Schema != nil {
			c.use.Lock()
			err := c.adopt(info)
			c.use.Unlock()
			if err != nil {
				return nil, err
			}
			continue
		}
		if err := sleep(ctx, wait); err != nil {
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
	if err := c.enter(); err != nil {
		return SampleInfo{}, err
	}
	defer c.use.RUnlock()
	if c.bytes {
		td, info, err := c.sampleBytes(ctx, n)
		if err != nil {
			return SampleInfo{}, err
		}
		if err := dst.SetSlice(0, td); err != nil {
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
	if err := c.refresh(ctx, resp.ID); err != nil {
		return SampleInfo{}, err
	}
	storage, slots, _, _ := c.mapping()
	if storage == nil {
		return SampleInfo{}, fmt.Errorf("replay: no mapping of the buffer's storage")
	}
	info := resp.Info
	if err := checkPicks(info, n, slots.len()); err != nil {
		return SampleInfo{}, err
	}
	_, err = gatherChecked(storage, slots, dst, &info, func(k int) (SampleInfo, error) {
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

func (c *Client) sampleCall(ctx context.Context, n int, bytes bool) (sampleResponse, error) {
	return call[sampleResponse](ctx, c, MethodSample, sampleRequest{Name: c.name, N: n, Bytes: bytes})
}

// UpdatePriority sets the priorities of sampled transitions, as
// Buffer.UpdatePriority does.
func (c *Client) UpdatePriority(ctx context.Context, info SampleInfo, priorities []float64) (int, error) {
	resp, err := call[updateResponse](ctx, c, MethodUpdatePriority,
		updateRequest{Name: c.name, Info: info, Priorities: priorities})
	return resp.Updated, err
}

// Checkpoint has the node checkpoint the buffer (Buffer.Checkpoint).
func (c *Client) Checkpoint(ctx context.Context) error {
	_, err := call[rpc.Empty](ctx, c, MethodCheckpoint, nameRequest{Name: c.name})
	return err
}

// Stats returns the buffer's counters, and the Go heap of the node serving
// it (Stats.NodeHeap).
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return call[Stats](ctx, c, MethodStats, nameRequest{Name: c.name})
}

// Close closes the connection and unmaps the storage, after the calls in
// flight return.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.stop()            // ends a prefetch
	err := c.rc.Close() // calls in flight fail now
	c.use.Lock()
	defer c.use.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unmapLocked()
	return err
}

// call is rpc.Call of c's node, retried as retry says; ErrClosed once c is
// closed.
func call[Resp, Req any](ctx context.Context, c *Client, method string, req Req) (Resp, error) {
	var resp Resp
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return resp, ErrClosed
	}
	err := c.retry(ctx, func() (err error) {
		resp, err = rpc.Call[Resp](ctx, c.rc, method, req)
		return err
	})
	return resp, err
}

// retry runs call until it succeeds, fails with an error other than
// Unavailable, or ctx ends; Unavailable (the node unreachable, or the
// connection broken) is tried again after a backoff of 20 ms doubling to
// 1 s. Errors match their replay sentinels by their reasons (errors.go).
func (c *Client) retry(ctx context.Context, call func() error) error {
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		err := call()
		if err == nil || !errors.Is(err, rpc.ErrUnavailable) || errors.Is(err, rpc.ErrClosed) {
			return err
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if errors.Is(err, rpc.ErrClosed) {
			return err
		}
		if serr := sleep(ctx, wait); serr != nil {
			return fmt.Errorf("%w; the node was unreachable: %w", serr, err)
		}
	}
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
