package loader

import (
	"context"
	"errors"
	"io"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The methods of the loader service (docs/loader.md describes their
// messages). Every request names the loader it is for.
const (
	MethodJoin    = "loader.join"    // a call: the consumer joins
	MethodConsume = "loader.consume" // a message stream: batches one way, acks the other
	MethodLeave   = "loader.leave"   // a call: the consumer leaves
	MethodStats   = "loader.stats"   // a call: the producer's Stats
)

// maxAnnounce bounds the announcements the producer hands a stream at once.
const maxAnnounce = 1024

// Service is the loader service of an rpc.Server: the producers it serves,
// by name, to consumers that Dial them. A producer whose ring folder is
// under the server's root (rpc.WithRoot) is read by reference by consumers
// on the same filesystem, and by bytes by the others.
//
// A Service is safe for concurrent use; producers can be added and
// removed while it serves.
type Service struct {
	producers *service.Registry[*Producer]
	remotes   remotes // the loaders whose producer is another process (remote.go)
}

// Register adds the loader service's methods to s and returns the
// Service, empty: Add producers to it. Call it once per server.
func Register(s *rpc.Server) (*Service, error) {
	svc := &Service{producers: service.NewRegistry(s, service.Spec{
		Pkg: "loader", Kind: "loader", Config: ErrConfig, Exists: ErrExists, NotFound: ErrNotFound,
	}, func(p *Producer) string { return p.ring.path })}
	regs := []error{
		rpc.Register(s, MethodJoin, svc.join),
		rpc.RegisterStream(s, MethodConsume, svc.consume),
		rpc.Register(s, MethodLeave, svc.leave),
		rpc.Register(s, MethodStats, svc.stats),
		rpc.RegisterStream(s, MethodProduce, svc.produce),
	}
	for _, err := range regs {
		if err != nil {
			return nil, err
		}
	}
	return svc, nil
}

// Add serves p under name. p stays the caller's: Remove it (or close the
// server) before closing it. A name already served is ErrExists.
func (svc *Service) Add(name string, p *Producer) error { return svc.producers.Add(name, p) }

// Remove stops serving the producer named name; calls for it fail with
// ErrNotFound from then on.
func (svc *Service) Remove(name string) { svc.producers.Remove(name) }

// The messages. Field names on the wire are the codec tags.
type (
	joinRequest struct {
		Name  string `codec:"name"`
		Batch int    `codec:"batch"` // the consumer's batch size
		Bytes bool   `codec:"bytes"` // it will ask for bytes (informational: the stream's request decides)
	}
	joinResponse struct {
		Ring        string               `codec:"ring"`     // the ring's id: changes when the producer is made anew
		Consumer    uint64               `codec:"consumer"` // the consumer's id
		Epoch       int64                `codec:"epoch"`    // its first epoch
		Prefix      string               `codec:"prefix"`   // the ring's folder, relative to the node's root; "" when not under it (a consumer takes one that leaves its root for "")
		Schema      tensordict.RowSchema `codec:"schema"`   // of a row
		Samples     int                  `codec:"samples"`  // per epoch
		Batch       int                  `codec:"batch"`    // rows per producer batch
		Slots       int                  `codec:"slots"`
		HeartbeatMS int64                `codec:"heartbeat_ms"`     // silent this long, it is dropped
		Layout      string               `codec:"layout,omitempty"` // a remote producer's batch structure (remote.go); "" for a dict
	}
	consumeRequest struct {
		Name     string `codec:"name"`
		Ring     string `codec:"ring"`
		Consumer uint64 `codec:"consumer"`
		Epoch    int64  `codec:"epoch"` // the first batch it wants
		Index    int    `codec:"index"`
		Bytes    bool   `codec:"bytes"` // send the batches' rows
	}
	// batchMessage is the producer's: a batch published.
	batchMessage struct {
		Batch announcement `codec:"batch"`
		Rows  *rpc.TD      `codec:"rows"` // bytes mode: the batch's rows
	}
	// ackMessage is the consumer's: it is done with every batch before
	// (Epoch, Index). It is its heartbeat too.
	ackMessage struct {
		Epoch int64 `codec:"epoch"`
		Index int   `codec:"index"`
	}
	leaveRequest struct {
		Name     string `codec:"name"`
		Ring     string `codec:"ring"`
		Consumer uint64 `codec:"consumer"`
	}
	statsRequest struct {
		Name string `codec:"name"`
	}
)

// producer returns the producer named name, checking that ring is its
// ring's id ("" skips the check).
func (svc *Service) producer(name, ring string) (service.Entry[*Producer], error) {
	sp, err := svc.producers.Lookup(name)
	if err != nil {
		if r := svc.remotes.get(name); r != nil {
			return sp, r.unattached(ring)
		}
		return sp, err
	}
	if ring != "" && ring != sp.Item.ring.id {
		return sp, wrapf(ErrDropped, "the producer of %q restarted (ring %s, not %s)", name, sp.Item.ring.id, ring)
	}
	return sp, nil
}

func (svc *Service) join(_ context.Context, req joinRequest) (joinResponse, error) {
	sp, err := svc.producer(req.Name, "")
	if err != nil {
		return joinResponse{}, err
	}
	p := sp.Item
	ji, err := p.join(req.Batch)
	if err != nil {
		return joinResponse{}, err
	}
	return joinResponse{
		Ring: p.ring.id, Consumer: ji.id, Epoch: ji.epoch, Prefix: sp.Rel, Schema: p.schema, Layout: p.layout,
		Samples: p.n, Batch: p.cfg.Batch, Slots: p.cfg.Slots, HeartbeatMS: p.cfg.Heartbeat.Milliseconds(),
	}, nil
}

// consume serves a consumer's stream: it sends every batch published for
// the consumer from the request's position on, with its rows in bytes
// mode, and applies the consumer's acks, until the consumer ends the
// stream (it leaves), the stream breaks (it is dropped), or the producer
// drops it. An ack of a batch the producer never had drops the consumer
// too; the stream ends with ErrDropped saying so.
func (svc *Service) consume(ctx context.Context, req consumeRequest, st *rpc.ServerStream[ackMessage, batchMessage]) error {
	if !req.Bytes {
		// The consumer reads the batches from its own mapping of the ring,
		// which the producer rewrites in place: only one page cache shows
		// it those writes.
		if err := rpc.RequireCoherent(ctx, "reading the ring"); err != nil {
			return err
		}
	}
	sp, err := svc.producer(req.Name, req.Ring)
	if err != nil {
		return err
	}
	p := sp.Item
	if err := p.release(req.Consumer, req.Epoch, req.Index); err != nil { // a heartbeat, and the consumer exists
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := p.track(cancel); err != nil { // a remote producer's ring stays mapped until this returns
		return err
	}
	defer p.untrack()
	acks := make(chan error, 1) // the ack reader's end, exactly once
	go func() {
		cut := true // whether the reader's end stops the sends
		defer func() {
			if cut {
				cancel()
			}
		}()
		for {
			a, err := st.Recv(ctx)
			if err == nil {
				err = p.release(req.Consumer, a.Epoch, a.Index)
				if err != nil && p.unusable() != nil {
					// The producer failed, closed or lost its process:
					// push returns that too,
					// once the batch being sent is whole. Cancelling now
					// would cut that send short, and the stream would
					// end reset, without the error the consumer is owed.
					cut = false
				} else if errors.Is(err, ErrArgument) {
					// An ack of a batch the producer never had: the
					// consumer is dropped, and push says so once the
					// batch being sent is whole, as above.
					p.leave(req.Consumer, true)
					cut = false
				}
			}
			if testHookAckErr != nil && err != nil {
				testHookAckErr(err)
			}
			if errors.Is(err, io.EOF) {
				// The consumer ended its side: it leaves. Counted now,
				// before cancel stops a send that may be mid-message,
				// which can end the stream other than with OK: the
				// consumer, whose Close waits for the stream's end,
				// must find itself counted as left whatever that end.
				p.leave(req.Consumer, false)
			}
			if err != nil {
				acks <- err
				return
			}
		}
	}()
	err = svc.send(ctx, p, req, st)
	cancel()
	ackErr := <-acks
	if gone := p.goneErr(); gone != nil {
		return gone // the producer process detached (or failed): ErrNoProducer, or its error
	}
	switch {
	case errors.Is(ackErr, io.EOF): // the consumer ended its side: it has left (above)
		return nil
	case errors.Is(ackErr, ErrArgument): // dropped for it (above): told why, not only that
		return wrapf(ErrDropped, "its ack: %v", ackErr)
	case errors.Is(err, ErrDropped), errors.Is(err, ErrClosed), errors.Is(err, ErrFailed):
		return err // the producer's decision: the consumer is gone already
	case errors.Is(ackErr, ErrDropped), errors.Is(ackErr, ErrClosed), errors.Is(ackErr, ErrFailed):
		return ackErr
	default: // the stream broke, or the node is closing
		p.leave(req.Consumer, true)
		return err
	}
}

// Test hooks, nil outside tests: testHookAckErr gets the error that ends
// a consume stream's ack reader; testHookBeforeSend runs before a batch
// is sent on a consume stream.
var (
	testHookAckErr     func(err error)
	testHookBeforeSend func(ctx context.Context, a announcement)
)

// send sends the consumer's batches on st until an error. By bytes each
// batch is the copy out of the ring that every consumer by bytes shares
// (Producer.copies), held until Send has written its bytes (or failed),
// which it has when it returns.
func (svc *Service) send(ctx context.Context, p *Producer, req consumeRequest, st *rpc.ServerStream[ackMessage, batchMessage]) error {
	epoch, index := req.Epoch, req.Index
	for {
		as, err := p.push(ctx, req.Consumer, &epoch, &index)
		if err != nil {
			return err
		}
		for _, a := range as {
			if err := svc.sendOne(ctx, p, a, req.Bytes, st); err != nil {
				return err
			}
		}
	}
}

// sendOne sends the batch a announces, with its rows when bytes.
func (svc *Service) sendOne(ctx context.Context, p *Producer, a announcement, bytes bool, st *rpc.ServerStream[ackMessage, batchMessage]) error {
	msg := batchMessage{Batch: a}
	if bytes {
		bc, err := p.copies.acquire(p, a)
		if err != nil {
			return err
		}
		defer p.copies.release(bc)
		msg.Rows = &rpc.TD{TensorDict: bc.td, Seal: bc.seal}
	}
	if testHookBeforeSend != nil {
		testHookBeforeSend(ctx, a)
	}
	return st.Send(ctx, msg)
}

func (svc *Service) leave(_ context.Context, req leaveRequest) (rpc.Empty, error) {
	sp, err := svc.producer(req.Name, req.Ring)
	if err != nil {
		return rpc.Empty{}, nil // nothing to leave
	}
	sp.Item.leave(req.Consumer, false)
	return rpc.Empty{}, nil
}

func (svc *Service) stats(_ context.Context, req statsRequest) (Stats, error) {
	sp, err := svc.producer(req.Name, "")
	if err != nil {
		return Stats{}, err
	}
	return sp.Item.Stats(), nil
}
