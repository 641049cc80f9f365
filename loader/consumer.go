package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/backoff"
	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/internal/slots"
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

// session is one membership of the producer: from a join until a drop,
// the producer restarting, or Close. Its stream (MethodConsume) brings the
// batches published for it and carries its acks, which are its heartbeats
// too.
type session struct {
	c      *Consumer
	info   joinResponse
	schema tensordict.RowSchema
	reader *ringReader // nil in bytes mode
	bytes  bool
	// views are the views of the ring handed out (Options.Views), by their
	// first row and rows, made once: a batch that lies where an earlier
	// one did is the same TensorDict, as a copied batch is the same
	// buffer. Used by the session's assemble goroutine only.
	views map[[2]int]*tensordict.TensorDict

	stream   *rpc.Stream[ackMessage, batchMessage]
	msgs     chan batchMessage // from the stream, in order; closed when it ends
	ackEvery int               // releases are sent once they move this many batches (or at a heartbeat)

	mu        sync.Mutex
	relEpoch  int64 // done with every batch before (relEpoch, relIndex)
	relIndex  int
	sentEpoch int64 // the release position the producer was last sent
	sentIndex int
	dirty     chan struct{} // signalled when the release has moved ackEvery batches
	err       error         // why the stream ended; set before msgs is closed

	stop func()         // ends the goroutines
	done sync.WaitGroup // the goroutines
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

// session returns the current session, joining the producer if there is
// none. A session that ended since the last call is its error, once.
//
// With wait (Batches), the node being unreachable is ridden out: a join
// that finds it so is tried again after the backoff, until it succeeds,
// fails otherwise, or ctx ends; and a session whose stream broke for that
// reason while no loop ran is not an error (no batch of an epoch was
// lost): the consumer joins again once the node is back.
func (c *Consumer) session(ctx context.Context, wait *backoff.Backoff) (*session, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if s := c.sess; s != nil && s.streamErr() == nil {
		c.mu.Unlock()
		return s, nil
	}
	old := c.sess
	c.sess = nil
	c.mu.Unlock()
	if old != nil {
		// The session ended while no loop ran (dropped between epochs, the
		// producer restarted): say so once; the next call joins again.
		old.end(ctx)
		if err := old.streamErr(); wait == nil || !unreachable(err) {
			return nil, fmt.Errorf("loader: before epoch %d: %w", c.Epoch(), err)
		}
	}
	var s *session
	for {
		var err error
		if s, err = c.join(ctx); err == nil {
			break
		}
		if c.isClosed() {
			return nil, ErrClosed // Close closed the connection under the join
		}
		if wait == nil || !unreachable(err) {
			return nil, err
		}
		if werr := wait.Wait(ctx); werr != nil {
			return nil, fmt.Errorf("%w; the node was unreachable: %w", werr, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		s.end(ctx)
		return nil, ErrClosed
	}
	c.sess, c.epoch, c.last = s, s.info.Epoch, s.info
	return s, nil
}

// ringGone says why the ring of a join (resp) went away as it was mapped
// (err): the failure of the producer process that wrote it, which the node
// records before it removes the ring and tells a consume stream of that
// ring (ErrFailed: the consumer's loop ends with it, as it would have a
// moment later), or else ErrNoProducer, waited out for the next process.
// It was ErrNoProducer always: a consumer that joined a process failing
// on its third batch waited a minute for a producer no one would start.
func (c *Consumer) ringGone(ctx context.Context, resp joinResponse, err error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, serr := rpc.OpenStream[ackMessage, batchMessage](ctx, c.rc, MethodConsume, consumeRequest{
		Name: c.name, Ring: resp.Ring, Consumer: resp.Consumer, Epoch: resp.Epoch, Bytes: true,
	})
	if serr == nil {
		_, serr = st.Recv(ctx)
		st.Close()
	}
	if errors.Is(serr, ErrFailed) {
		return serr
	}
	return wrapf(ErrNoProducer, "the ring %s went away as it was mapped: %v", resp.Prefix, err)
}

// testHookJoined, nil outside tests, runs once a join is answered, before
// the consumer maps the ring.
var testHookJoined func(resp joinResponse)

// unreachable reports whether err says the node could not be reached or
// the connection to it broke (rpc's Unavailable), what a node restarting
// looks like, rather than that the consumer's own client is closed.
func unreachable(err error) bool {
	return errors.Is(err, rpc.ErrUnavailable) && !errors.Is(err, rpc.ErrClosed)
}

// isClosed reports whether Close was called.
func (c *Consumer) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// join joins the producer, opens the session's stream and starts its
// goroutines.
func (c *Consumer) join(ctx context.Context) (*session, error) {
	// The ring is rewritten in place: references need one page cache
	// (rpc.Coherent), not only the same files.
	lv, shared, err := c.o.dialing().Mode(ctx, c.rc, true, rpc.Coherent)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.sharing = lv
	c.mu.Unlock()
	resp, err := rpc.Call[joinResponse](ctx, c.rc, MethodJoin, joinRequest{Name: c.name, Batch: c.o.Batch, Bytes: !shared})
	if err != nil {
		return nil, err
	}
	s := &session{c: c, info: resp, schema: resp.Schema, relEpoch: resp.Epoch, sentEpoch: resp.Epoch,
		dirty: make(chan struct{}, 1), ackEvery: max(1, resp.Slots/4)}
	if err := checkJoin(resp, c.o.Batch); err != nil {
		s.leave()
		return nil, err
	}
	if err := s.schema.Validate(); err != nil {
		s.leave()
		return nil, fmt.Errorf("loader: the node describes the batches badly: %w", err)
	}
	s.bytes = !shared || resp.Prefix == "" || !filepath.IsLocal(filepath.FromSlash(resp.Prefix))
	if testHookJoined != nil {
		testHookJoined(resp)
	}
	if !s.bytes {
		path := filepath.Join(c.o.Root, filepath.FromSlash(resp.Prefix))
		if s.reader, err = openRingReader(path, s.schema, resp.Slots, resp.Batch); err != nil {
			s.leave()
			if _, serr := os.Stat(path); resp.Layout != "" && errors.Is(serr, fs.ErrNotExist) {
				// A producer process's ring removed under the join: it
				// detached meanwhile.
				return nil, c.ringGone(ctx, resp, err)
			}
			return nil, fmt.Errorf("loader: mapping the ring: %w", err)
		}
	}
	bg, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.stream, err = rpc.OpenStream[ackMessage, batchMessage](bg, c.rc, MethodConsume, consumeRequest{
		Name: c.name, Ring: resp.Ring, Consumer: resp.Consumer, Epoch: resp.Epoch, Bytes: s.bytes,
	})
	if err != nil {
		stop()
		s.leave()
		if s.reader != nil {
			s.reader.close()
		}
		return nil, err
	}
	// The producer publishes at most a ring ahead of the consumer.
	s.msgs = make(chan batchMessage, min(resp.Slots, maxAnnounce)+1)
	s.done.Add(2)
	go s.receive(bg)
	go s.heartbeat(bg)
	return s, nil
}

// maxHeartbeatMS bounds a join response's heartbeat period (35 years):
// beyond it, a time.Duration of it overflows.
const maxHeartbeatMS = 1 << 40

// checkJoin checks that a join response is one a producer gives a
// consumer of batch rows a batch: a ring of 1 to 2^31 rows (Config's
// bound) that holds a consumer batch, samples whose batches can be
// counted, a first epoch of 0 or more and a heartbeat period that is
// not negative.
func checkJoin(r joinResponse, batch int) error {
	var bad string
	switch {
	case r.Slots < 1 || r.Batch < 1 || int64(r.Slots) > 1<<31 || int64(r.Batch) > 1<<31 || int64(r.Slots)*int64(r.Batch) > 1<<31:
		bad = fmt.Sprintf("a ring of %d slots of %d rows", r.Slots, r.Batch)
	case int64(batch) > int64(r.Slots)*int64(r.Batch):
		bad = fmt.Sprintf("a ring of %d rows for a consumer of batch %d", r.Slots*r.Batch, batch)
	case r.Samples < 1 || r.Samples > math.MaxInt-max(r.Batch, batch):
		bad = fmt.Sprintf("%d samples", r.Samples)
	case r.Epoch < 0 || r.Epoch == math.MaxInt64:
		bad = fmt.Sprintf("epoch %d", r.Epoch)
	case r.HeartbeatMS < 0 || r.HeartbeatMS > maxHeartbeatMS:
		bad = fmt.Sprintf("a heartbeat of %d ms", r.HeartbeatMS)
	default:
		return nil
	}
	return fmt.Errorf("loader: the node's answer to join is no producer's: %s", bad)
}

// receive passes the stream's messages to msgs until the stream ends.
func (s *session) receive(ctx context.Context) {
	defer s.done.Done()
	defer close(s.msgs)
	for {
		m, err := s.stream.Recv(ctx)
		if err != nil {
			if err == io.EOF { // the handler returned nil
				err = wrapf(ErrDropped, "the producer ended the consumer's stream")
			}
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			return
		}
		select {
		case s.msgs <- m:
		case <-ctx.Done():
			return
		}
	}
}

// heartbeat sends the session's release position to the producer each
// time it moves ackEvery batches or to another epoch, and at least four
// times per heartbeat period, until the session ends.
func (s *session) heartbeat(ctx context.Context) {
	defer s.done.Done()
	every := max(time.Duration(s.info.HeartbeatMS)*time.Millisecond/4, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.dirty:
		}
		e, i := s.position()
		sctx, cancel := context.WithTimeout(ctx, 4*every)
		err := s.stream.Send(sctx, ackMessage{Epoch: e, Index: i})
		cancel()
		if err != nil {
			return // the stream is over; receive says why
		}
		s.sent(e, i)
	}
}

// release records that the consumer is done with every batch before
// (epoch, index). The heartbeat goroutine sends it at once when it moved
// to another epoch or ackEvery batches from the position last sent, and
// otherwise with the next heartbeat.
func (s *session) release(epoch int64, index int) {
	s.mu.Lock()
	if epoch > s.relEpoch || (epoch == s.relEpoch && index > s.relIndex) {
		s.relEpoch, s.relIndex = epoch, index
	}
	urgent := s.relEpoch != s.sentEpoch || s.relIndex-s.sentIndex >= s.ackEvery
	s.mu.Unlock()
	if urgent {
		select {
		case s.dirty <- struct{}{}:
		default:
		}
	}
}

// position returns the release position.
func (s *session) position() (int64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.relEpoch, s.relIndex
}

// sent records that the producer has the release position (epoch, index).
func (s *session) sent(epoch int64, index int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if epoch > s.sentEpoch || (epoch == s.sentEpoch && index > s.sentIndex) {
		s.sentEpoch, s.sentIndex = epoch, index
	}
}

// streamErr returns why the session's stream ended, or nil.
func (s *session) streamErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// leave tells the producer the consumer is gone, best effort.
func (s *session) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rpc.Call[rpc.Empty](ctx, s.c.rc, MethodLeave, leaveRequest{Name: s.c.name, Ring: s.info.Ring, Consumer: s.info.Consumer})
}

// end ends the stream (the producer counts the consumer as gone when it
// sees its end), stops the goroutines and unmaps the ring.
func (s *session) end(context.Context) {
	if s.streamErr() == nil {
		// Tell the producer, and wait (a little) for it to end the stream:
		// it has counted the consumer gone then. Cancelling the stream at
		// once would look like the consumer's process dying.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if s.stream.CloseSend(ctx) == nil {
		drain:
			for {
				select {
				case _, ok := <-s.msgs:
					if !ok {
						break drain
					}
				case <-ctx.Done():
					break drain
				}
			}
		}
		cancel()
	}
	s.stop()
	s.stream.Close()
	s.done.Wait()
	if s.reader != nil {
		s.reader.close()
	}
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
// loop gives up the rest of the epoch; the next call iterates the next
// epoch.
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

// lost ends the session after err and reports true if err means it is
// over (the next Batches joins again), and false for the end of the
// loop's context.
func (c *Consumer) lost(s *session, err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if !errors.Is(err, rpc.ErrUnavailable) {
			return false
		}
	}
	c.mu.Lock()
	if c.sess == s {
		c.sess = nil
	}
	c.mu.Unlock()
	go s.end(context.Background())
	return true
}

// assemble fills batches of size batch from the producer's batches of
// epoch, in order, less the first skip samples of the consumer's share
// (Resume), and sends them on out (closed at the epoch's end); it takes
// buffers from pool. An error is sent as the last item.
func (s *session) assemble(ctx context.Context, epoch int64, skip, batch int, dropLast bool, out chan<- assembled, pool <-chan *batchBuf) {
	fail := func(err error) {
		select {
		case out <- assembled{err: err}:
		case <-ctx.Done():
		}
	}
	// A rank's share (Options.WorldSize): its rows of each batch, and the
	// padding, kept aside until the epoch's end, where it ends the share.
	sh := newShare(s.c.o.Rank, s.c.o.WorldSize, s.info.Samples)
	// With views (Options.Views), the producer's batches are released as
	// the loop is done with the items that hold them (item.done), not as
	// they are copied: relTo is where the item being assembled takes the
	// release position once done with.
	views := s.c.o.Views && sh == nil
	relTo := 0
	releaser := func(to int) func(bool) error {
		return func(used bool) error {
			if used {
				s.release(epoch, to)
			}
			return nil
		}
	}
	var cur *batchBuf
	pos, index := 0, 0
	send := func(n int) bool {
		a := assembled{buf: cur, n: n}
		if views {
			a.done = releaser(relTo)
		}
		select {
		case out <- a:
			cur, pos = nil, 0
			return true
		case <-ctx.Done():
			if a.done != nil {
				a.done(false)
			}
			return false
		}
	}
	// sendView sends rows [off, off+n) of the batch a announces as a view.
	sendView := func(a announcement, rows *tensordict.TensorDict, off, n int) bool {
		td, check, err := s.view(a, rows, off, n)
		if err != nil {
			fail(err)
			return false
		}
		rel := releaser(relTo)
		item := assembled{td: td, n: n, done: func(used bool) error {
			err := check(used)
			if err == nil {
				err = rel(used)
			}
			return err
		}}
		select {
		case out <- item:
			return true
		case <-ctx.Done():
			item.done(false)
			return false
		}
	}
	// take cuts n rows of the batch a announces into batches: those at
	// offsets sel, or its first n when sel is nil.
	take := func(a announcement, rows *tensordict.TensorDict, sel []int, n int) bool {
		for off := 0; off < n; {
			if views && cur == nil && sel == nil {
				// A batch within this one is a view of it; the epoch's
				// last, short batch too (unless dropped).
				k := min(batch, n-off)
				last := a.Index+1 == a.Count && off+k == n
				if k == batch || last {
					if relTo = a.Index; off+k == n {
						relTo = a.Index + 1
					}
					if k < batch && dropLast {
						off += k
						continue
					}
					if !sendView(a, rows, off, k) {
						return false
					}
					off += k
					continue
				}
			}
			if cur == nil {
				select {
				case cur = <-pool:
				case <-ctx.Done():
					return false
				}
				// Rows of the schema have come (checked in next), or
				// the ring that holds them is mapped: only now is
				// the batch's memory more than a node's word.
				if err := cur.alloc(); err != nil {
					fail(err)
					return false
				}
			}
			k := min(batch-pos, n-off)
			var err error
			if sel == nil {
				err = s.copyRows(cur, pos, a, rows, off, k)
			} else {
				err = s.copySel(cur, pos, a, rows, sel[off:off+k])
			}
			if err != nil {
				fail(err)
				return false
			}
			pos += k
			off += k
			if relTo = a.Index; off == n {
				relTo = a.Index + 1
			}
			if pos == batch && !send(batch) {
				return false
			}
		}
		return true
	}
	var stash *batchBuf
	var sel []int
	if sh != nil && len(sh.pad) > 0 {
		stash = newBatchBuf(s.schema, len(sh.pad))
	}
	for {
		anns, rows, err := s.next(ctx, epoch, index)
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, rpc.ErrUnavailable) {
				return // the loop stopped
			}
			fail(err)
			return
		}
		for _, a := range anns {
			if sh == nil && skip > 0 {
				// Resumed: the batch's rows past those skipped.
				k := min(skip, a.Rows)
				skip -= k
				sel = span(sel[:0], k, a.Rows)
				if !take(a, rows, sel, len(sel)) {
					return
				}
			} else if sh == nil {
				if !take(a, rows, nil, a.Rows) {
					return
				}
			} else {
				first := a.Index * s.info.Batch
				for i, e := range sh.pad {
					if e >= first && e < first+a.Rows {
						err := stash.alloc()
						if err == nil {
							err = s.copySel(stash, i, a, rows, []int{e - first})
						}
						if err != nil {
							fail(err)
							return
						}
					}
				}
				sel = sh.own(sel[:0], first, a.Rows)
				k := min(skip, len(sel))
				skip -= k
				if !take(a, rows, sel[k:], len(sel)-k) {
					return
				}
			}
			if !views {
				s.release(epoch, a.Index+1)
			}
			index = a.Index + 1
			if index == a.Count {
				if stash != nil && skip < len(sh.pad) {
					// The padding ends the share (less what Resume skips).
					sel = span(sel[:0], skip, len(sh.pad))
					if !take(announcement{}, stash.td, sel, len(sel)) {
						return
					}
				}
				if pos > 0 && !dropLast && !send(pos) {
					return
				}
				end := assembled{end: true}
				if views {
					end.done = releaser(a.Count)
				}
				select {
				case out <- end:
				case <-ctx.Done():
				}
				return
			}
		}
	}
}

// next returns the batch of epoch at index, as its stream brings it, and
// its rows in bytes mode; it passes over the batches before it (of an
// epoch the loop gave up).
func (s *session) next(ctx context.Context, epoch int64, index int) ([]announcement, *tensordict.TensorDict, error) {
	for {
		var m batchMessage
		var ok bool
		select {
		case m, ok = <-s.msgs:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if !ok {
			return nil, nil, fmt.Errorf("loader: epoch %d, batch %d: %w", epoch, index, s.streamErr())
		}
		a := m.Batch
		if a.Epoch < epoch || (a.Epoch == epoch && a.Index < index) {
			continue
		}
		if a.Epoch != epoch || a.Index != index {
			return nil, nil, fmt.Errorf("loader: waiting for batch %d of epoch %d, got %d of %d", index, epoch, a.Index, a.Epoch)
		}
		if err := s.checkAnnouncement(a); err != nil {
			return nil, nil, err
		}
		var rows *tensordict.TensorDict
		if s.bytes {
			if m.Rows == nil || m.Rows.TensorDict == nil || m.Rows.Len() != a.Rows {
				return nil, nil, fmt.Errorf("loader: batch %d of epoch %d came without its %d rows", index, epoch, a.Rows)
			}
			if err := s.schema.Match(m.Rows.RowSchema()); err != nil {
				return nil, nil, fmt.Errorf("loader: the rows of batch %d of epoch %d are not the joined schema's: %w", index, epoch, err)
			}
			rows = m.Rows.TensorDict
		}
		return []announcement{a}, rows, nil
	}
}

// checkAnnouncement checks that a is what the producer the session joined
// announces for batch a.Index of an epoch: the epoch's count of batches,
// the rows of the batch at that place, a slot of the ring holding a
// published batch.
func (s *session) checkAnnouncement(a announcement) error {
	i := s.info
	count := (i.Samples + i.Batch - 1) / i.Batch
	rows := 0
	if a.Index >= 0 && a.Index < count {
		rows = min(i.Batch, i.Samples-a.Index*i.Batch)
	}
	if a.Count != count || a.Rows != rows || a.Slot < 0 || a.Slot >= i.Slots || slots.State(a.Word) != statePublished {
		return fmt.Errorf("loader: the node announced batch %d of epoch %d as %+v; a producer of %d samples in batches of %d, "+
			"with %d slots, announces %d batches, this one of %d rows, in a published slot", a.Index, a.Epoch, a,
			i.Samples, i.Batch, i.Slots, count, rows)
	}
	return nil
}

// copyRows copies rows [off, off+n) of the batch a announces into dst at
// row pos: from the ring (then checks the slot's word: a batch overwritten
// while it was copied is ErrDropped), or from rows, the batch's bytes.
func (s *session) copyRows(dst *batchBuf, pos int, a announcement, rows *tensordict.TensorDict, off, n int) error {
	if rows != nil {
		part, err := rows.Slice(off, off+n)
		if err != nil {
			return err
		}
		view, err := dst.td.Slice(pos, pos+n)
		if err != nil {
			return err
		}
		return gatherFrom(view, part)
	}
	r := s.reader
	for i, l := range r.leaves {
		rb := dst.rb[i]
		at := l.off + int64(a.Slot*r.batch+off)*int64(rb)
		if _, err := l.mm.ReadAt(dst.leaves[i][pos*rb:(pos+n)*rb], at); err != nil {
			return err
		}
	}
	return r.unchanged(a, "it was read")
}

// maxViews bounds the views a session keeps (a small consumer batch of a
// large ring has many places); the others are made each time.
const maxViews = 1024

// view returns rows [off, off+n) of the batch a announces without copying
// them (Options.Views): a view of the ring's mapping, or of rows, the
// batch's bytes. done(used) is called once the loop is done with it: the
// mapping is kept until then (Close waits for it to unmap), and with used
// it checks the slot's word, ErrDropped if the slot was rewritten while
// the view was read.
func (s *session) view(a announcement, rows *tensordict.TensorDict, off, n int) (td *tensordict.TensorDict, done func(used bool) error, err error) {
	if rows != nil {
		td, err := rows.Slice(off, off+n)
		return td, func(bool) error { return nil }, err
	}
	r := s.reader
	if !r.acquire() {
		return nil, nil, wrapf(ErrClosed, "the ring was unmapped")
	}
	check := func() error { return r.unchanged(a, "the loop read it") }
	start := a.Slot*r.batch + off
	key := [2]int{start, n}
	if td = s.views[key]; td == nil {
		if td, err = r.joined.Slice(start, start+n); err == nil {
			if s.views == nil {
				s.views = map[[2]int]*tensordict.TensorDict{}
			}
			if len(s.views) < maxViews {
				s.views[key] = td
			}
		}
	}
	if err == nil {
		err = check()
	}
	if err != nil {
		r.done()
		return nil, nil, err
	}
	return td, func(used bool) error {
		defer r.done()
		if used {
			return check()
		}
		return nil
	}, nil
}

// gatherFrom copies src's tensors into dst's of the same keys (same row
// counts).
func gatherFrom(dst, src *tensordict.TensorDict) error {
	for path, t := range src.Leaves() {
		d, err := dst.Tensor(path...)
		if err != nil {
			return err
		}
		if err := d.SetSlice(0, t); err != nil {
			return err
		}
	}
	return nil
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

// span appends the rows from, from+1, ..., to-1 to sel.
func span(sel []int, from, to int) []int {
	for o := from; o < to; o++ {
		sel = append(sel, o)
	}
	return sel
}
