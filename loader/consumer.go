package loader

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Consumer iterates the batches of a producer served by a node, as a
// training job iterates its own data loader: Batches once per epoch, each
// batch Options.Batch rows cut from the producer's batches, every sample
// of the epoch exactly once, in the producer's order.
//
// When the consumer shares the node's filesystem (Options.Root has the
// node root's identity) and the ring lies under it, it maps the ring and
// copies each batch's rows out of it, checking the slot's generation after
// the copy: no batch bytes cross the network, only the announcements and
// the acks. Otherwise the rows travel as bytes. SharedFS says which. With
// Options.Views it copies nothing where a batch lies within one slot: the
// batch is a read-only view of the slot, held until the loop's body
// returns, and the generation is checked then.
//
// A consumer heartbeats from a goroutine of its own while it is joined, so
// a loop's body may train for as long as it likes on a batch without being
// dropped for silence; it is dropped if it holds the producer up for
// longer than the producer's MaxWait on one batch.
//
// A Consumer is used by one goroutine at a time, but Close may be called
// from any.
type Consumer struct {
	rc       *rpc.Client
	name     string
	o        Options
	prefetch int

	mu      sync.Mutex
	closed  bool
	sess    *session    // nil before a join, and after a drop until the next Batches
	epoch   int64       // the epoch the next Batches iterates
	sharing rpc.Sharing // at the last join
	last    joinResponse
	bufs    []*batchBuf // the batch buffers, kept across epochs
	state   State       // where the loop is (State)
	resume  *State      // Resume's, until an epoch at or past it begins
}

// Dial connects to the producer served as name by the node at addr and
// joins it as a consumer of opts.Batch rows a batch. ErrArgument for a
// batch size of 0 or less or larger than the producer's ring, ErrNotFound
// when the node serves no loader by that name; an error (matching no
// sentinel) when the node's answer is not one a producer gives. A loader
// whose producer process has not attached yet (ErrNoProducer) is waited
// for, with backoff, until ctx ends.
func Dial(ctx context.Context, addr, name string, opts Options) (*Consumer, error) {
	if opts.Batch <= 0 {
		return nil, wrapf(ErrArgument, "batch size %d: want at least 1", opts.Batch)
	}
	if err := opts.checkShare(); err != nil {
		return nil, err
	}
	rc, err := opts.dialing().Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	c := &Consumer{rc: rc, name: name, o: opts, prefetch: prefetchOf(opts)}
	wait := service.Backoff()
	for {
		_, err := c.session(ctx, nil)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, ErrNoProducer) { // a producer process yet to attach: wait for it, as Batches does
			if werr := wait.Wait(ctx); werr == nil {
				continue
			}
		}
		rc.Close()
		return nil, err
	}
}

// Len returns the number of batches of an epoch: the producer's samples
// (a rank's share of them, with Options.WorldSize) cut into batches of
// Options.Batch rows.
func (c *Consumer) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.last.Samples
	if sh := newShare(c.o.Rank, c.o.WorldSize, n); sh != nil {
		n = sh.samples()
	}
	return batchLen(n, c.o.Batch, c.o.DropLast)
}

// Samples returns the number of samples in an epoch: the producer's, all
// ranks' (a rank's share is ceil(Samples / WorldSize)).
func (c *Consumer) Samples() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.Samples
}

// Epoch returns the epoch the next call of Batches iterates (after a drop,
// the join it makes may move it on).
func (c *Consumer) Epoch() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// SharedFS reports whether the consumer reads the batches from its own
// mapping of the ring (true) or gets them as bytes.
func (c *Consumer) SharedFS() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess != nil && !c.sess.bytes
}

// Sharing returns how much of the node's root the consumer shared at its
// last join (rpc.None without a root; Options.Bytes does not change it). Reading the
// ring from its own mapping needs rpc.Coherent.
func (c *Consumer) Sharing() rpc.Sharing {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sharing
}

// Schema returns the schema of the batches' rows.
func (c *Consumer) Schema() tensordict.RowSchema {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.Schema.Clone()
}

// isClosed reports whether Close was called.
func (c *Consumer) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// batchBuf is a consumer's batch in Go memory, reused across batches. Its
// memory is allocated on first use (alloc): a consumer's once the first
// batch has come, so that a schema a node describes costs no memory until
// rows of it arrive.
type batchBuf struct {
	schema tensordict.RowSchema
	n      int                    // rows
	td     *tensordict.TensorDict // nil until alloc
	leaves [][]byte               // its tensors' bytes, in the schema's order
	rb     []int                  // their row sizes
}

// newBatchBuf returns a buffer of n rows of schema, its memory not yet
// allocated.
func newBatchBuf(schema tensordict.RowSchema, n int) *batchBuf {
	return &batchBuf{schema: schema, n: n}
}

// alloc allocates b's memory, once.
func (b *batchBuf) alloc() error {
	if b.td != nil {
		return nil
	}
	td, err := b.schema.Zeros(b.n)
	if err != nil {
		return err
	}
	var leaves [][]byte
	var rb []int
	for _, f := range b.schema {
		t, err := td.Tensor(f.Key...)
		if err != nil {
			return err
		}
		raw, err := t.Bytes()
		if err != nil {
			return err
		}
		leaves, rb = append(leaves, raw), append(rb, rowBytes(f))
	}
	b.td, b.leaves, b.rb = td, leaves, rb
	return nil
}

// assembled is a batch ready to yield, the error that ends the epoch, or
// the epoch's end.
type assembled struct {
	buf *batchBuf
	td  *tensordict.TensorDict // a view (Options.Views), yielded as it is; buf is nil
	n   int
	err error
	end bool
	// done, when set, is called once iterate is done with the item: used
	// after the loop's body returned for it (or at the epoch's end),
	// !used when it was never yielded. With used it releases what the
	// item held and checks a view's slot, returning ErrDropped if it was
	// rewritten meanwhile.
	done func(used bool) error
}

// Batches returns an iterator over the next epoch's batches, which ends
// with the epoch: the first call iterates the epoch the consumer joined,
// each later call the one after. A batch is valid until the loop's body
// returns (its memory is reused): Clone it to keep it. With Options.Views
// a batch may be a read-only view of the ring, valid as long and no
// longer (writing into it faults), and a view whose slot was rewritten
// while the body read it makes the next item ErrDropped. Breaking out of the
// loop, or ctx ending, gives up the rest of the epoch (all of it when it
// had not begun); the consumer stays joined, and the next call iterates
// the next epoch.
//
// The node restarting is ridden out, as replay's and store's clients
// do: while the node is unreachable Batches waits for it, joining again
// after a backoff with full jitter, its bound 20 ms doubling to 1 s
// (service.Backoff), until ctx ends; then it iterates the epoch the
// producer serves the consumer (a restarted producer begins at the epoch
// after the last one it began; Epoch says which). Only an epoch of which
// batches were yielded cannot be resumed: its loop ends with an error
// matching rpc.ErrUnavailable, and the next call waits for the node.
//
// An error ends the epoch and is yielded once: ErrDropped (the producer
// dropped the consumer, or restarted), an error matching
// rpc.ErrUnavailable (the node went away during the epoch), ErrClosed,
// ErrFailed, ctx's (wrapping the last Unavailable error when the node was
// unreachable until ctx ended), or one matching no sentinel when the node
// sends what no producer does (docs/loader.md, "The protocol"). The next
// call of Batches then joins the producer again, at the start of its
// current epoch if that epoch's window is open, else of the next one;
// Epoch says which.
func (c *Consumer) Batches(ctx context.Context) iter.Seq2[*tensordict.TensorDict, error] {
	return func(yield func(*tensordict.TensorDict, error) bool) {
		wait := service.Backoff()
		for {
			s, err := c.session(ctx, &wait)
			if err != nil {
				yield(nil, err)
				return
			}
			c.mu.Lock()
			epoch := c.epoch
			c.epoch++
			resumed := c.resume // back if the loop yields nothing (rejoin)
			skip := c.skipOf(epoch)
			c.mu.Unlock()
			c.bufs = ensureBufs(c.bufs, s.schema, c.o.Batch, c.prefetch)
			// The node going away before the epoch's first batch is
			// ridden out: nothing of the epoch was yielded.
			yielded, rejoin := false, false
			y := func(td *tensordict.TensorDict, err error) bool {
				if err != nil && !yielded && unreachable(err) && ctx.Err() == nil && !c.isClosed() {
					rejoin = true
					return false
				}
				yielded = true
				if td != nil {
					c.mu.Lock()
					c.state.Samples += td.Len()
					c.mu.Unlock()
				}
				return yield(td, err)
			}
			complete, err := iterate(ctx, y, c.bufs, c.prefetch, c.o.Batch,
				func(ctx context.Context, out chan<- assembled, pool <-chan *batchBuf) {
					s.assemble(ctx, epoch, skip, c.o.Batch, c.o.DropLast, out, pool)
				})
			if rejoin {
				c.mu.Lock()
				c.resume = resumed
				c.mu.Unlock()
				c.lost(s, err)
				if werr := wait.Wait(ctx); werr != nil {
					yield(nil, fmt.Errorf("%w; the node was unreachable: %w", werr, err))
					return
				}
				continue
			}
			if !complete && (err == nil || !c.lost(s, err)) {
				s.release(epoch+1, 0) // gives up the rest of the epoch
			}
			return
		}
	}
}

// State is where a consumer is in its epochs, for a restarted job to
// resume mid-epoch (Consumer.State, Consumer.Resume): the epoch iterated
// and the samples of the consumer's share of it (the whole epoch, or a
// rank's share with Options.WorldSize) yielded so far, and whose share
// that is. Its JSON is the Python client's state_dict ({"epoch": E,
// "samples": S, "rank": R, "world_size": W}), so either language may save
// it and the other resume from it.
type State struct {
	Epoch   int64 `json:"epoch"`
	Samples int   `json:"samples"`
	// Rank and WorldSize are the share's (Options.Rank, and
	// Options.WorldSize or 1 for the whole epoch). A WorldSize of 0 (a
	// State saved without them) is not checked.
	Rank      int `json:"rank"`
	WorldSize int `json:"world_size"`
}

// State returns where the consumer is: the epoch of the current or last
// loop of Batches and the samples of its share that loop has yielded (a
// batch counts once yielded, whether or not the loop's body finished
// with it). Save it where the job saves its checkpoint; give it to the
// consumer of the restarted job with Resume. Before any loop its epoch
// and samples are 0. Safe to call from any goroutine.
func (c *Consumer) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.state
	st.Rank, st.WorldSize = c.o.Rank, max(c.o.WorldSize, 1)
	return st
}

// Resume makes the consumer skip what a consumer of the same share had
// yielded when s was its State (that of a job that was stopped or
// killed), as the Python client's load_state_dict does: when the
// epoch the next loop of Batches iterates is s.Epoch, that loop yields
// the share less its first s.Samples samples (rows that travel or are
// copied all the same: nothing else of the epoch changes); when it is a
// later epoch, the loop yields that epoch whole and s is forgotten.
// Either way no sample of s's epoch comes twice. A consumer of the same
// producer, Batch size aside, joins s's epoch again only while its window
// is open (Config.Window): the producer does not replay an epoch.
//
// s must be the State of the same share: another Rank or WorldSize (the
// State of another rank, say) is ErrArgument and changes nothing, since
// skipping another share's count would drop samples of this one. Call it
// before Batches.
func (c *Consumer) Resume(s State) error {
	if s.WorldSize != 0 && (s.Rank != c.o.Rank || s.WorldSize != max(c.o.WorldSize, 1)) {
		return wrapf(ErrArgument, "resume: the state is rank %d of %d's share, this consumer is rank %d of %d",
			s.Rank, s.WorldSize, c.o.Rank, max(c.o.WorldSize, 1))
	}
	if s.Samples < 0 {
		return wrapf(ErrArgument, "resume: %d samples yielded: want 0 or more", s.Samples)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resume = &s
	return nil
}

// skipOf returns the samples of epoch's share that Resume skips, and
// makes the epoch's State. c.mu is held.
func (c *Consumer) skipOf(epoch int64) int {
	skip := 0
	if r := c.resume; r != nil {
		if epoch == r.Epoch {
			skip = max(r.Samples, 0)
		}
		if epoch >= r.Epoch {
			c.resume = nil
		}
	}
	c.state = State{Epoch: epoch, Samples: skip}
	return skip
}

// iterate yields the batches produce sends on out, taking buffers from a
// pool of bufs, up to prefetch of them assembled ahead, until produce
// sends the epoch's end or an error, yield returns false, or ctx ends.
// It returns whether the epoch ended, and the error yielded (nil if
// none). produce runs in a goroutine of its own, which has returned when
// iterate does.
func iterate(ctx context.Context, yield func(*tensordict.TensorDict, error) bool, bufs []*batchBuf, prefetch, batch int,
	produce func(ctx context.Context, out chan<- assembled, pool <-chan *batchBuf)) (complete bool, err error) {
	actx, cancel := context.WithCancel(ctx)
	out := make(chan assembled, prefetch)
	pool := make(chan *batchBuf, len(bufs))
	for _, b := range bufs {
		pool <- b
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer close(out)
		produce(actx, out, pool)
	}()
	defer func() {
		cancel()
		<-finished
		for a := range out { // assembled ahead, never yielded
			if a.done != nil {
				a.done(false)
			}
		}
	}()
	for a := range out {
		if a.end {
			if a.done != nil {
				if err := a.done(true); err != nil {
					yield(nil, err)
					return false, err
				}
			}
			return true, nil
		}
		if a.err != nil {
			yield(nil, a.err)
			return false, a.err
		}
		td := a.td
		if td == nil {
			td = a.buf.td
			if a.n < batch {
				if td, err = td.Slice(0, a.n); err != nil {
					yield(nil, err)
					return false, err
				}
			}
		}
		ok := yield(td, nil)
		if a.buf != nil {
			pool <- a.buf
		}
		if a.done != nil {
			if err := a.done(ok); err != nil && ok {
				yield(nil, err)
				return false, err
			}
		}
		if !ok {
			return false, nil
		}
	}
	// out closed without the epoch's end: ctx ended.
	err = ctx.Err()
	if err == nil {
		err = ErrClosed
	}
	yield(nil, err)
	return false, err
}

// ensureBufs returns bufs with enough batch buffers of batch rows of
// schema for iterate with prefetch: those in the channel, the one
// yielded, the one being assembled. Buffers of another schema are
// dropped. The new ones are allocated on first use.
func ensureBufs(bufs []*batchBuf, schema tensordict.RowSchema, batch, prefetch int) []*batchBuf {
	if len(bufs) > 0 && schema.Match(bufs[0].schema) != nil {
		bufs = nil
	}
	for len(bufs) < prefetch+2 {
		bufs = append(bufs, newBatchBuf(schema, batch))
	}
	return bufs
}

// Close leaves the producer, unmaps the ring and closes the connection.
// An iteration in progress ends with ErrClosed or an error matching
// rpc.ErrUnavailable.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.sess
	c.sess = nil
	c.mu.Unlock()
	if s != nil {
		s.end(context.Background())
	}
	return c.rc.Close()
}
