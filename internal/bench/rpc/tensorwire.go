package rpc

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The tensorwire system: the workloads as rpc calls, the way a user would
// write them. Small requests and responses are msgpack byte strings; bulk
// payloads and stream messages are uint8 tensors in a TensorDict argument,
// which (with no shared root) travel as raw bytes after the msgpack header,
// on a side connection (protocol version 3) when they are 256 KiB or more.
// The stream is a message stream (rpc.RegisterStream, rpc.OpenStream):
// the client sends its messages in order and closes its side, the server
// checks each as it arrives and answers with one message, the byte count.
type tensorwireSystem struct{}

func init() { register(tensorwireSystem{}) }

func (tensorwireSystem) name() string { return "tensorwire" }

type twSmall struct {
	B []byte `codec:"b"`
}

type twPayload struct {
	Data rpc.TD `codec:"data"`
}

type twAck struct {
	N uint64 `codec:"n"` // the bulk id, or the stream's byte count so far
}

func (tensorwireSystem) serve(ctx context.Context, ln net.Listener) error {
	// Compression off on both sides: raw TCP and grpc-go move the
	// payloads as they are, so tensorwire does too.
	s, err := rpc.NewServer(rpc.WithCompression(false))
	if err != nil {
		return err
	}
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
	rpc.RegisterStream(s, "stream", func(ctx context.Context, _ rpc.Empty, st *rpc.ServerStream[twPayload, twAck]) error {
		// Each message is checked and dropped before the next: its memory
		// can serve the next one.
		st.ReuseBuffers()
		var check streamCheck
		for {
			m, err := st.Recv(ctx)
			if err == io.EOF {
				return st.Send(ctx, twAck{N: uint64(check.total())})
			}
			if err != nil {
				return err
			}
			b, err := payloadBytes(m.Data)
			if err != nil {
				return err
			}
			if err := check.add(b); err != nil {
				return rpc.Errorf(rpc.InvalidArgument, "%v", err)
			}
		}
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
	st, err := rpc.OpenStream[twPayload, twAck](ctx, c.c, "stream", rpc.Empty{})
	if err != nil {
		return err
	}
	defer st.Close()
	err = sendStream(ctx, total, msgSize, func(msg []byte) error {
		td, err := payloadTD(msg)
		if err != nil {
			return err
		}
		return st.Send(ctx, twPayload{Data: td})
	})
	if err == nil {
		err = st.CloseSend(ctx)
	}
	if err != nil {
		if _, rerr := st.Recv(ctx); rerr != nil && rerr != io.EOF {
			return fmt.Errorf("%w (the server: %v)", err, rerr)
		}
		return err
	}
	ack, err := st.Recv(ctx)
	if err != nil {
		return fmt.Errorf("end of stream: %w", err)
	}
	if _, err := st.Recv(ctx); err != io.EOF {
		return fmt.Errorf("after the stream's ack: %v", err)
	}
	return checkStreamAck(total, int64(ack.N))
}

func (c *twClient) Close() error { return c.c.Close() }
