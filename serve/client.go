package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Client is a model served by a node (Service), used from another process
// or machine: torch_spread's client.
//
// A client has slots: Input() and Output(), TensorDicts of Slots() rows
// with the model's input and output row schemas. When the client shares
// the node's filesystem (its root, WithRoot, has the node root's identity)
// the slots are files under the root (ClientsDir), registered with the
// node once: a request then carries only (client, rows), the node gathers
// the rows from the client's input slots into its batch and scatters the
// outputs straight into the client's output slots, and no row crosses the
// network. Otherwise the slots are in Go memory and the rows travel with
// the calls. Mode says which.
//
// Predict and Go take free slots for each call, so any number may run at
// once; PredictInto works on rows the caller chose, as torch_spread's
// predict_inplace does on its one buffer.
//
// Calls ride out the node restarting: a call that finds the node
// unreachable is tried again, with backoff, until its context ends, and a
// client whose registration the node lost (it restarted, or the lease ran
// out) registers again by itself. A Client is safe for concurrent use;
// Close it when done.
type Client struct {
	rc      *rpc.Client
	calls   service.Caller // rc's calls, tried again while the node is unreachable
	name    string
	info    infoResponse
	bytes   bool
	sharing rpc.Sharing // at Dial
	slots   int
	in      *tensordict.TensorDict // the slots: mappings of the files in dir, or Go memory
	out     *tensordict.TensorDict
	inF     fields // their tensors
	outF    fields
	dir     string // the slots' folder; "" in bytes mode
	rel     string // dir relative to the root
	root    string // this side's view of the root
	lock    *lockfile.Lock
	free    *slotRanges
	ring    *clientRing   // requests by bell (bell.go); nil for calls only
	use     sync.RWMutex  // requests by bell hold it shared; Close unmaps the ring under it
	gen     atomic.Uint64 // registrations made: a request waiting by bell sends itself again when it changes
	quiet   time.Duration // waitQuiet's bound: quietWait

	bg   context.Context // ends at Close: the renewer's
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	closed bool
	id     uint64 // the node's registration; 0 when not registered
	regMu  sync.Mutex
}

// DialOption configures Dial.
type DialOption func(*dialOptions)

type dialOptions struct {
	service.Dialing // root, bytes, rpc's options
	slots           int
}

// WithRoot sets this side's view of the shared root (rpc.WithRoot), which
// lets the client keep its slots in files the node maps, when the node
// shares it.
func WithRoot(dir string) DialOption { return func(o *dialOptions) { o.Root = dir } }

// WithBytes makes the rows travel as bytes even when the filesystem is
// shared.
func WithBytes() DialOption { return func(o *dialOptions) { o.Bytes = true } }

// WithSlots sets how many rows of slots the client has (default: the
// model's max batch). Predict and Go of more rows than that fail with
// ErrSchema; more slots let more calls run at once.
func WithSlots(n int) DialOption { return func(o *dialOptions) { o.slots = n } }

// WithRPC passes options to rpc.Dial: a token, TLS, a logger, limits.
func WithRPC(opts ...rpc.Option) DialOption {
	return func(o *dialOptions) { o.RPC = append(o.RPC, opts...) }
}

// Dial connects to the model served as name by the node at addr and, when
// the two share a filesystem, makes the client's slots and registers them.
// ErrNotFound if the node serves no model of that name.
func Dial(ctx context.Context, addr, name string, opts ...DialOption) (_ *Client, err error) {
	var o dialOptions
	for _, opt := range opts {
		opt(&o)
	}
	rc, err := o.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	c := &Client{rc: rc, name: name, root: o.Root, quiet: quietWait}
	c.calls = service.Caller{RPC: rc, Methods: repeatable, Closed: c.isClosed, ErrClosed: ErrClosed}
	c.bg, c.stop = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.info, err = service.Call[infoResponse](ctx, &c.calls, MethodInfo, infoRequest{Name: name}); err != nil {
		return nil, err
	}
	if c.info.MaxBatch < 1 || c.info.MaxBatch > maxRows || c.info.Input.Validate() != nil || c.info.Output.Validate() != nil {
		return nil, fmt.Errorf("serve: the node describes model %q badly (max batch %d, input %v, output %v)",
			name, c.info.MaxBatch, c.info.Input, c.info.Output)
	}
	c.slots = o.slots
	if c.slots == 0 {
		c.slots = c.info.MaxBatch
	}
	if c.slots < 1 || c.slots > maxRows {
		return nil, configErrorf("%d slots; want 1 to %d", c.slots, maxRows)
	}
	c.free = newSlotRanges(c.slots)
	// Slots, ring and bell are rewritten in place: references need one
	// page cache (rpc.Coherent), not only the same files. The client's
	// folder is under its own root, which the node maps through its own.
	var shared bool
	if c.sharing, shared, err = o.Mode(ctx, rc, true, rpc.Coherent); err != nil {
		return nil, err
	}
	c.bytes = !shared
	if c.bytes {
		if c.in, err = c.info.Input.Zeros(c.slots); err != nil {
			return nil, err
		}
		if c.out, err = c.info.Output.Zeros(c.slots); err != nil {
			return nil, err
		}
		return c, nil
	}
	if err := c.makeSlots(o.Root); err != nil {
		return nil, err
	}
	if c.inF, err = fieldsOf(c.in, c.info.Input); err != nil {
		return nil, err
	}
	if c.outF, err = fieldsOf(c.out, c.info.Output); err != nil {
		return nil, err
	}
	if err := c.register(ctx, 0); err != nil {
		return nil, err
	}
	c.wg.Add(1)
	go c.renewEvery(time.Duration(c.info.LeaseMS) * time.Millisecond / 4)
	return c, nil
}

// makeSlots makes the client's folder under root, holding its lock: first
// under a temporary name, renamed into place once locked, so that no one
// takes an unlocked folder for a dead client's. It removes the folders of
// dead clients it finds there.
func (c *Client) makeSlots(root string) error {
	parent := filepath.Join(root, filepath.FromSlash(ClientsDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("serve: making the client's slots: %w", err)
	}
	if err := checkFolders(root, ClientsDir); err != nil {
		return fmt.Errorf("serve: making the client's slots: %w", err)
	}
	removeDead(root, ClientsDir, clientDirRE)
	removeDead(root, BellsDir, bellDirRE)
	var id [8]byte
	rand.Read(id[:])
	name := hex.EncodeToString(id[:])
	tmp := filepath.Join(parent, ".tmp-"+name)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fmt.Errorf("serve: making the client's slots: %w", err)
	}
	lock, err := lockfile.Acquire(filepath.Join(tmp, "lock"))
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("serve: making the client's slots: %w", err)
	}
	fail := func(err error) error {
		lock.Release()
		os.RemoveAll(tmp)
		return fmt.Errorf("serve: making the client's slots: %w", err)
	}
	in, err := c.info.Input.Create(filepath.Join(tmp, "in"), c.slots)
	if err != nil {
		return fail(err)
	}
	in.Close()
	out, err := c.info.Output.Create(filepath.Join(tmp, "out"), c.slots)
	if err != nil {
		return fail(err)
	}
	out.Close()
	if err := c.makeRing(tmp); err != nil {
		return fail(err)
	}
	dir := filepath.Join(parent, name)
	if err := os.Rename(tmp, dir); err != nil {
		return fail(err)
	}
	c.dir, c.rel, c.lock = dir, ClientsDir+"/"+name, lock
	if c.in, err = tensordict.LoadMemmap(filepath.Join(dir, "in")); err == nil {
		c.out, err = tensordict.LoadMemmap(filepath.Join(dir, "out"))
	}
	if err != nil {
		return fmt.Errorf("serve: mapping the client's slots: %w", err)
	}
	return nil
}

// removeDead removes the folders under rel, under root, whose lock is
// free: those of clients, or of nodes' bells, that died. Folders not of
// the form re accepts, those being made (".tmp-"), and links are left.
func removeDead(root, rel string, re *regexp.Regexp) {
	entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() && re.MatchString(rel+"/"+e.Name()) {
			removeIfDead(root, rel+"/"+e.Name())
		}
	}
}

// register registers the client's slots with the node, unless the
// registration it holds is not old (the one that failed, or 0).
func (c *Client) register(ctx context.Context, old uint64) error {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	id := c.id
	c.mu.Unlock()
	if id != old {
		return nil // registered again meanwhile
	}
	resp, err := service.Call[registerResponse](ctx, &c.calls, MethodRegister,
		registerRequest{Name: c.name, Prefix: c.rel, Slots: c.slots, Ring: c.ring != nil})
	if err != nil {
		return err
	}
	if err := c.useBell(resp.Bell); err != nil {
		return err
	}
	c.mu.Lock()
	c.id = resp.Client
	c.mu.Unlock()
	c.gen.Add(1)
	return nil
}

// renewEvery renews the registration every d, registering again when the
// node lost it, until Close.
func (c *Client) renewEvery(d time.Duration) {
	defer c.wg.Done()
	if d <= 0 {
		d = time.Second
	}
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-c.bg.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		id := c.id
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(c.bg, d)
		_, err := rpc.Call[rpc.Empty](ctx, c.rc, MethodRenew, clientRequest{Name: c.name, Client: id})
		if errors.Is(err, ErrNotRegistered) {
			c.register(ctx, id)
		}
		cancel()
	}
}

// Sharing returns how much of the node's root the client shared at Dial
// (rpc.None without a root; WithBytes does not change it); Mode is "ref" at
// rpc.Coherent only.
func (c *Client) Sharing() rpc.Sharing { return c.sharing }

// SharedFS reports whether the client works by reference (Mode is "ref"),
// as the other services' clients say it.
func (c *Client) SharedFS() bool { return !c.bytes }

// Mode returns "ref" when the rows stay in slots the node maps and "bytes"
// when they travel with the calls.
func (c *Client) Mode() string {
	if c.bytes {
		return "bytes"
	}
	return "ref"
}

// Input returns the client's input slots: a TensorDict of batch size
// [Slots()] with the model's input fields, to write rows into for
// PredictInto. It is valid until Close.
func (c *Client) Input() *tensordict.TensorDict { return c.in }

// Output returns the client's output slots, where PredictInto leaves the
// outputs. It is valid until Close.
func (c *Client) Output() *tensordict.TensorDict { return c.out }

// Slots returns how many rows the client's slots hold.
func (c *Client) Slots() int { return c.slots }

// MaxBatch returns the model's max batch: the most rows one call holds.
func (c *Client) MaxBatch() int { return c.info.MaxBatch }

// InputSchema and OutputSchema return the model's row schemas.
func (c *Client) InputSchema() tensordict.RowSchema  { return c.info.Input.Clone() }
func (c *Client) OutputSchema() tensordict.RowSchema { return c.info.Output.Clone() }

// Predict runs the model on in, a TensorDict of batch size [n] with the
// model's input fields, 1 <= n <= min(MaxBatch(), Slots()), and returns
// the outputs (in Go memory, the caller's) and the parameter version that
// produced them. By reference it copies in into free slots and the
// outputs out of them; the rows cross no network.
//
// Errors: ErrSchema (nothing was sent), ErrQueueFull (back off and try
// again), ErrForward, ErrClosed, or ctx's error.
func (c *Client) Predict(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, uint64, error) {
	n, err := checkRows(in, c.info.Input, min(c.info.MaxBatch, c.slots), "input")
	if err != nil {
		return nil, 0, err
	}
	if c.bytes {
		resp, err := c.predict(ctx, predictRequest{Name: c.name, N: n, In: &rpc.TD{TensorDict: in}})
		if err != nil {
			return nil, 0, err
		}
		if resp.Out == nil || resp.Out.TensorDict == nil {
			return nil, 0, fmt.Errorf("serve: the node sent no outputs")
		}
		if err := checkOut(resp.Out.TensorDict, c.info.Output, n); err != nil {
			return nil, 0, fmt.Errorf("serve: the node's outputs: %w", err)
		}
		return resp.Out.TensorDict, resp.Version, nil
	}
	src, err := fieldsOf(in, c.info.Input)
	if err != nil {
		return nil, 0, err
	}
	out, err := c.info.Output.Zeros(n)
	if err != nil {
		return nil, 0, err
	}
	dst, err := fieldsOf(out, c.info.Output)
	if err != nil {
		return nil, 0, err
	}
	start, err := c.free.take(ctx, n)
	if err != nil {
		return nil, 0, err
	}
	if err := copyRows(c.inF, start, src, 0, n); err != nil {
		c.free.put(start, n)
		return nil, 0, err
	}
	v, seq, err := c.predictRows(ctx, start, n)
	if err != nil {
		if seq != 0 && ctx.Err() != nil {
			// The node may still write these slots: keep them until it is
			// done with the request.
			go func() {
				c.waitQuiet(start, seq)
				c.free.put(start, n)
			}()
		} else {
			c.free.put(start, n)
		}
		return nil, 0, err
	}
	defer c.free.put(start, n)
	if err := copyRows(dst, 0, c.outF, start, n); err != nil {
		return nil, 0, err
	}
	return out, v, nil
}

// PredictInto runs the model on rows [start, start+n) of Input() and
// leaves the outputs in the same rows of Output(), returning the
// parameter version that produced them: torch_spread's predict_inplace.
// By reference the request carries only (client, start, n). The caller
// owns those rows for the call: do not change them meanwhile, nor give
// them to concurrent calls.
func (c *Client) PredictInto(ctx context.Context, start, n int) (uint64, error) {
	switch {
	case n < 1 || n > c.info.MaxBatch:
		return 0, schemaErrorf("a request of %d rows; want 1 to %d (the max batch)", n, c.info.MaxBatch)
	case start < 0 || start > c.slots-n:
		return 0, schemaErrorf("rows [%d, %d) of %d slots", start, start+n, c.slots)
	}
	if !c.bytes {
		v, _, err := c.predictRows(ctx, start, n)
		return v, err
	}
	in, err := c.in.Slice(start, start+n)
	if err != nil {
		return 0, err
	}
	resp, err := c.predict(ctx, predictRequest{Name: c.name, N: n, In: &rpc.TD{TensorDict: in}})
	if err != nil {
		return 0, err
	}
	if resp.Out == nil || resp.Out.TensorDict == nil {
		return 0, fmt.Errorf("serve: the node sent no outputs")
	}
	if err := checkOut(resp.Out.TensorDict, c.info.Output, n); err != nil {
		return 0, fmt.Errorf("serve: the node's outputs: %w", err)
	}
	return resp.Version, c.out.SetSlice(start, resp.Out.TensorDict)
}

// predictRows asks the node to run the client's rows [start, start+n):
// by bell when the client has a ring and the node a bell (Linux), else by
// call, registering again when the node lost the registration. It returns
// the request's sequence number by bell, 0 by call.
func (c *Client) predictRows(ctx context.Context, start, n int) (uint64, uint32, error) {
	for {
		c.mu.Lock()
		id, closed := c.id, c.closed
		c.mu.Unlock()
		if closed {
			return 0, 0, ErrClosed
		}
		if id == 0 {
			if err := c.register(ctx, 0); err != nil {
				return 0, 0, err
			}
			continue
		}
		if c.ring != nil {
			v, seq, err := c.predictBell(ctx, start, n)
			if !errors.Is(err, errNoBellYet) {
				return v, seq, err
			}
		}
		resp, err := c.predict(ctx, predictRequest{Name: c.name, Client: id, Start: start, N: n})
		if errors.Is(err, ErrNotRegistered) {
			if err := c.register(ctx, id); err != nil {
				return 0, 0, err
			}
			continue
		}
		return resp.Version, 0, err
	}
}

func (c *Client) predict(ctx context.Context, req predictRequest) (predictResponse, error) {
	return service.Call[predictResponse](ctx, &c.calls, MethodPredict, req)
}

// Call is a prediction in progress, started by Go.
type Call struct {
	done    chan struct{}
	out     *tensordict.TensorDict
	version uint64
	err     error
}

// Go starts Predict(ctx, in) and returns at once; the Call delivers its
// result. in must not change until the Call is done.
func (c *Client) Go(ctx context.Context, in *tensordict.TensorDict) *Call {
	call := &Call{done: make(chan struct{})}
	go func() {
		defer close(call.done)
		call.out, call.version, call.err = c.Predict(ctx, in)
	}()
	return call
}

// Done is closed when the prediction has finished.
func (p *Call) Done() <-chan struct{} { return p.done }

// Wait blocks until the prediction has finished and returns Predict's
// results.
func (p *Call) Wait() (*tensordict.TensorDict, uint64, error) {
	<-p.done
	return p.out, p.version, p.err
}

// Stats returns the manager's counters, with the clients registered.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return service.Call[Stats](ctx, &c.calls, MethodStats, infoRequest{Name: c.name})
}

// Close unregisters the client, closes the connection and removes its
// slots, after the calls in flight return (they fail now).
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	id := c.id
	c.mu.Unlock()
	c.stop()
	if id != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		rpc.Call[rpc.Empty](ctx, c.rc, MethodUnregister, clientRequest{Name: c.name, Client: id})
		cancel()
	}
	err := c.rc.Close()
	c.wg.Wait()
	if c.free != nil {
		c.free.close()
		c.free.wait() // Predict copies out of the slots until it returns
	}
	c.closeRing()
	if c.dir != "" {
		if c.in != nil {
			c.in.Close()
		}
		if c.out != nil {
			c.out.Close()
		}
		os.RemoveAll(c.dir)
		c.lock.Release()
	}
	return err
}
