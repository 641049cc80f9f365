package rpc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// The grpc-go system, without protoc: a hand-written service description
// and a codec whose messages are raw byte slices, so no generated code and
// no protobuf encoding. Small and Bulk are unary methods; Stream is
// client-streaming, answered once with the byte count. Acks (the bulk call
// id, the stream byte count) are 8 bytes, little-endian.
//
// The configuration is the fair, common one for large messages: message
// size limits raised to maxMessage, static 16 MiB stream and connection
// flow-control windows on both sides, insecure credentials over loopback,
// and one ClientConn (one HTTP/2 connection) shared by all callers.
type grpcSystem struct{}

func init() { register(grpcSystem{}) }

func (grpcSystem) name() string { return "grpc" }

const (
	grpcService      = "tensorwire.bench.Bench"
	grpcMethodSmall  = "/" + grpcService + "/Small"
	grpcMethodBulk   = "/" + grpcService + "/Bulk"
	grpcMethodStream = "/" + grpcService + "/Stream"
	grpcWindow       = 16 << 20
)

// rawCodec marshals a []byte (or *[]byte) as itself and unmarshals into a
// *[]byte. Marshal does not copy; grpc-go copies a received message out of
// its buffers before Unmarshal (mem.BufferSlice.Materialize), as protobuf
// would copy a bytes field, so Unmarshal keeps the slice it is given.
type rawCodec struct{}

func (rawCodec) Name() string { return "raw" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case []byte:
		return m, nil
	case *[]byte:
		return *m, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*m = data
	return nil
}

// grpcHandler is the service's handler type; the methods are the functions
// of grpcDesc, so it has none.
type grpcHandler interface{}

var grpcDesc = grpc.ServiceDesc{
	ServiceName: grpcService,
	HandlerType: (*grpcHandler)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Small", Handler: grpcSmall},
		{MethodName: "Bulk", Handler: grpcBulk},
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "Stream", Handler: grpcStream, ClientStreams: true},
	},
}

func grpcSmall(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var req []byte
	if err := dec(&req); err != nil {
		return nil, err
	}
	if len(req) != smallSize {
		return nil, status.Errorf(codes.InvalidArgument, "small request of %d bytes, want %d", len(req), smallSize)
	}
	return smallReply(req), nil
}

func grpcBulk(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var payload []byte
	if err := dec(&payload); err != nil {
		return nil, err
	}
	id, err := checkBulk(payload)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return binary.LittleEndian.AppendUint64(nil, id), nil
}

func grpcStream(_ any, ss grpc.ServerStream) error {
	var check streamCheck
	for {
		var msg []byte
		err := ss.RecvMsg(&msg)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := check.add(msg); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return ss.SendMsg(binary.LittleEndian.AppendUint64(nil, uint64(check.total())))
}

func (grpcSystem) serve(ctx context.Context, ln net.Listener) error {
	s := grpc.NewServer(
		grpc.ForceServerCodec(rawCodec{}),
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.MaxSendMsgSize(maxMessage),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
	)
	s.RegisterService(&grpcDesc, nil)
	stop := context.AfterFunc(ctx, s.Stop)
	defer stop()
	err := s.Serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

type grpcClient struct{ cc *grpc.ClientConn }

func (grpcSystem) dial(ctx context.Context, addr string) (client, error) {
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodec(rawCodec{}),
			grpc.MaxCallRecvMsgSize(maxMessage),
			grpc.MaxCallSendMsgSize(maxMessage),
		),
		grpc.WithInitialWindowSize(grpcWindow),
		grpc.WithInitialConnWindowSize(grpcWindow),
	)
	if err != nil {
		return nil, err
	}
	c := &grpcClient{cc: cc}
	// NewClient connects lazily: connect now with one call, so that a
	// missing server fails here.
	if _, err := c.small(ctx, make([]byte, smallSize)); err != nil {
		cc.Close()
		return nil, fmt.Errorf("grpc: %w", err)
	}
	return c, nil
}

func (c *grpcClient) Close() error { return c.cc.Close() }

func (c *grpcClient) small(ctx context.Context, req []byte) ([]byte, error) {
	var resp []byte
	if err := c.cc.Invoke(ctx, grpcMethodSmall, req, &resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (c *grpcClient) bulk(ctx context.Context, payload []byte) error {
	var ack []byte
	if err := c.cc.Invoke(ctx, grpcMethodBulk, payload, &ack); err != nil {
		return err
	}
	if len(ack) != 8 {
		return fmt.Errorf("grpc: bulk ack of %d bytes", len(ack))
	}
	return checkBulkAck(payload, binary.LittleEndian.Uint64(ack))
}

func (c *grpcClient) stream(ctx context.Context, total int64, msgSize int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream on an early return
	cs, err := c.cc.NewStream(ctx, &grpcDesc.Streams[0], grpcMethodStream)
	if err != nil {
		return err
	}
	// SendMsg may return before the message is written: sendStream's
	// messages are never modified, so that is safe.
	err = sendStream(ctx, total, msgSize, func(msg []byte) error { return cs.SendMsg(msg) })
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	// After io.EOF from SendMsg (the server ended the call), RecvMsg
	// returns the server's status.
	if err == nil {
		if err := cs.CloseSend(); err != nil {
			return err
		}
	}
	var ack []byte
	if err := cs.RecvMsg(&ack); err != nil {
		return err
	}
	if len(ack) != 8 {
		return fmt.Errorf("grpc: stream ack of %d bytes", len(ack))
	}
	return checkStreamAck(total, int64(binary.LittleEndian.Uint64(ack)))
}
