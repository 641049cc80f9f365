package rpc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The tensorwire system: the workloads as rpc calls, the way a user would
// write them. Small requests and responses are msgpack byte strings; bulk
// payloads and stream messages are uint8 tensors in a TensorDict argument,
// which (with no shared root) travel as raw bytes after the msgpack header.
// The stream is a sequence of calls, one per message, with up to
// twStreamWindow of them in flight (rpc.Go), as a user would pipeline them;
// each carries its sequence number, and the server checks every message
// against the tag its number gives, whatever order handlers run in.
type tensorwireSystem struct{}

func init() { register(tensorwireSystem{}) }

func (tensorwireSystem) name() string { return "tensorwire" }

type twSmall struct {
	B []byte `codec:"b"`
}

type twPayload struct {
	Stream uint64 `codec:"stream"` // stream id; 0 for bulk
	Seq    int64  `codec:"seq"`    // the message's number in its stream
	Data   rpc.TD `codec:"data"`
}

// twStreamWindow is how many stream messages may be in flight at once.
const twStreamWindow = 4

type twAck struct {
	N uint64 `codec:"n"` // the bulk id, or the stream's byte count so far
}

type twStreams struct {
	mu sync.Mutex
	m  map[uint64]*twStream
}

// twStream counts what a stream delivered.
type twStream struct {
	msgs, bytes int64
}

func (tensorwireSystem) serve(ctx context.Context, ln net.Listener) error {
	// Compression off on both sides: raw TCP and grpc-go move the
	// payloads as they are, so tensorwire does too.
	s, err := rpc.NewServer(rpc.WithCompression(false))
	if err != nil {
		return err
	}
	streams := &twStreams{m: map[uint64]*twStream{}}
	rpc.Register(s, "small", func(_ context.Context, req twSmall) (twSmall, error) {
		if len(req.B) != smallSize {
			return twSmall{}, rpc.Errorf(rpc.InvalidArgument, "small request of %d bytes, want %d", len(req.B), smallSize)
		}
		return twSmall{B: smallReply(req.B)}, nil
	})
	rpc.Register(s, "bulk", func(_ context.Context, req twPayload) (twAck, error) {
		b, err := payloadBytes(req.Data)
		if err != nil {
			return twAck{}, err
		}
		id, err := checkBulk(b)
		if err != nil {
			return twAck{}, rpc.Errorf(rpc.InvalidArgument, "%v", err)
		}
		return twAck{N: id}, nil
	})
	rpc.Register(s, "stream", func(_ context.Context, req twPayload) (twAck, error) {
		b, err := payloadBytes(req.Data)
		if err != nil {
			return twAck{}, err
		}
		streams.mu.Lock()
		defer streams.mu.Unlock()
		st := streams.m[req.Stream]
		if st == nil {
			st = &twStream{}
			streams.m[req.Stream] = st
		}
		if len(b) == 0 { // the end of the stream: report and forget it
			delete(streams.m, req.Stream)
			if st.msgs != req.Seq {
				return twAck{}, rpc.Errorf(rpc.InvalidArgument, "%v: %d messages before message %d ended the stream", errVerify, st.msgs, req.Seq)
			}
			return twAck{N: uint64(st.bytes)}, nil
		}
		if err := checkStreamMessage(req.Seq, b); err != nil {
			return twAck{}, rpc.Errorf(rpc.InvalidArgument, "%v", err)
		}
		st.msgs++
		st.bytes += int64(len(b))
		return twAck{N: uint64(st.bytes)}, nil
	})
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	err = s.Serve(ln)
	s.Close()
	return err
}

// payloadBytes returns the bytes of a payload's single uint8 leaf.
func payloadBytes(td rpc.TD) ([]byte, error) {
	if td.TensorDict == nil {
		return nil, nil
	}
	x, err := td.Tensor("bytes")
	if err != nil {
		return nil, rpc.Errorf(rpc.InvalidArgument, "payload: %v", err)
	}
	return x.Bytes()
}

// payloadTD wraps b, without copying, as a TensorDict {"bytes": uint8 [len(b)]}.
func payloadTD(b []byte) (rpc.TD, error) {
	if len(b) == 0 {
		return rpc.TD{}, nil
	}
	x, err := tensordict.FromBytes(memmap.Uint8, []int{len(b)}, b)
	if err != nil {
		return rpc.TD{}, err
	}
	td, err := tensordict.New(len(b))
	if err == nil {
		err = td.Set("bytes", x)
	}
	return rpc.Ref(td), err
}

type twClient struct {
	c *rpc.Client
}

func (tensorwireSystem) dial(ctx context.Context, addr string) (client, error) {
	c, err := rpc.Dial(ctx, addr, rpc.WithCompression(false))
	if err != nil {
		return nil, err
	}
	return &twClient{c: c}, nil
}

func (c *twClient) small(ctx context.Context, req []byte) ([]byte, error) {
	resp, err := rpc.Call[twSmall](ctx, c.c, "small", twSmall{B: req})
	return resp.B, err
}

func (c *twClient) bulk(ctx context.Context, payload []byte) error {
	td, err := payloadTD(payload)
	if err != nil {
		return err
	}
	ack, err := rpc.Call[twAck](ctx, c.c, "bulk", twPayload{Data: td})
	if err != nil {
		return err
	}
	return checkBulkAck(payload, ack.N)
}

func (c *twClient) stream(ctx context.Context, total int64, msgSize int) error {
	id := rand.Uint64() | 1 // unique among the server's streams; never 0
	var (
		seq      int64
		inflight []*rpc.Future[twAck]
	)
	wait := func(f *rpc.Future[twAck]) error { _, err := f.Wait(); return err }
	err := sendStream(ctx, total, msgSize, func(msg []byte) error {
		if len(inflight) == twStreamWindow {
			if err := wait(inflight[0]); err != nil {
				return err
			}
			inflight = inflight[1:]
		}
		td, err := payloadTD(msg)
		if err != nil {
			return err
		}
		inflight = append(inflight, rpc.Go[twAck](ctx, c.c, "stream", twPayload{Stream: id, Seq: seq, Data: td}))
		seq++
		return nil
	})
	for _, f := range inflight { // every message answered before the end
		if werr := wait(f); err == nil {
			err = werr
		}
	}
	if err != nil {
		return err
	}
	ack, err := rpc.Call[twAck](ctx, c.c, "stream", twPayload{Stream: id, Seq: seq})
	if err != nil {
		return fmt.Errorf("end of stream: %w", err)
	}
	return checkStreamAck(total, int64(ack.N))
}

func (c *twClient) Close() error { return c.c.Close() }
