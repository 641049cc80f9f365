package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/backoff"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

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
	msgs     chan inbound // from the stream, in order; closed when it ends
	ackEvery int          // releases are sent once they move this many batches (or at a heartbeat)

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
	if s.bytes {
		// Each batch's rows in memory that comes back once the loop is
		// done with them (inbound.release), not in new memory a batch.
		s.stream.ReuseBuffers()
	}
	// The producer publishes at most a ring ahead of the consumer.
	s.msgs = make(chan inbound, min(resp.Slots, maxAnnounce)+1)
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

// inbound is a message of the stream, and how to give back the memory of
// its rows (by bytes) once nothing reads them any more: a rows' memory is
// used again for a later batch then (rpc's Stream.RecvHeld). Not calling
// release only forgoes that.
type inbound struct {
	batchMessage
	release func()
}

// receive passes the stream's messages to msgs until the stream ends.
func (s *session) receive(ctx context.Context) {
	defer s.done.Done()
	defer close(s.msgs)
	for {
		m, release, err := s.stream.RecvHeld(ctx)
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
		case s.msgs <- inbound{m, release}:
		case <-ctx.Done():
			release()
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
				case m, ok := <-s.msgs:
					if !ok {
						break drain
					}
					m.release()
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
