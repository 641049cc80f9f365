package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
)

// A system is one RPC implementation under test: a server, run in a child
// process (or a goroutine, in the tests), and a client to it. Adding one is
// one file that defines a type implementing system and registers it:
//
//	func init() { register(mySystem{}) }
//
// Every system speaks its own wire format but must keep the contract below,
// using the helpers of this file, so that all do the same work and none can
// skip reading what it is sent.
type system interface {
	// name is the system's key in --systems, the table and the JSON.
	name() string
	// serve serves clients on ln until ctx is done, then closes ln and
	// returns nil; it returns an error only if it cannot go on serving.
	// A request that fails verification fails (the client gets an error)
	// but the server goes on serving.
	serve(ctx context.Context, ln net.Listener) error
	// dial connects a client to a server listening on addr ("host:port").
	dial(ctx context.Context, addr string) (client, error)
}

// A client calls one server. The harness calls small from many goroutines
// at once (smallCallers of them) and the other methods from one goroutine
// at a time.
type client interface {
	// small sends req (smallSize bytes) and returns the server's response,
	// which must be smallReply(req), computed by the server.
	small(ctx context.Context, req []byte) ([]byte, error)
	// bulk sends payload (from newBulkPayload, normally bulkBytes long) in
	// one request. The server checks it with checkBulk and answers with the
	// id checkBulk returns (or checkBulk's error); the client returns
	// checkBulkAck(payload, id) (or the server's error).
	bulk(ctx context.Context, payload []byte) error
	// stream sends total bytes to the server in messages of msgSize bytes
	// (the last may be shorter) with sendStream. The server checks every
	// message with a streamCheck and, after the last one, answers with the
	// streamCheck's total (or its error); the client returns
	// checkStreamAck(total, answer) (or the server's error).
	stream(ctx context.Context, total int64, msgSize int) error
	Close() error
}

// registry holds every system by name; see register.
var registry = map[string]system{}

// register adds s to the registry; call it from an init function.
func register(s system) {
	if _, dup := registry[s.name()]; dup {
		panic("rpc benchmark: system " + s.name() + " registered twice")
	}
	registry[s.name()] = s
}

// systemOrder is the order of systems in the default --systems: these first,
// then any others by name.
var systemOrder = []string{"tensorwire", "grpc", "tcp"}

// registered returns the names of all registered systems in systemOrder.
func registered() []string {
	var names []string
	for _, n := range systemOrder {
		if _, ok := registry[n]; ok {
			names = append(names, n)
		}
	}
	var rest []string
	for n := range registry {
		if !slices.Contains(systemOrder, n) {
			rest = append(rest, n)
		}
	}
	slices.Sort(rest)
	return append(names, rest...)
}

// The workloads' sizes.
const (
	smallSize     = 16                // bytes of a small request and of its response
	bulkBytes     = 5 * 640 * 640 * 3 // 6,144,000: 5 rows of 640x640x3 uint8 images
	streamMsgSize = 1 << 20           // bytes per stream message
	maxMessage    = 64 << 20          // the largest message any server accepts
	sampleStride  = 4096              // verification reads one byte per page
)

// errVerify marks a request whose bytes are not what the workload sends.
var errVerify = errors.New("verification failed")

// smallReply returns the response to the small request req: its bytes
// complemented, so that the server has to read the request to answer.
func smallReply(req []byte) []byte { return appendSmallReply(nil, req) }

// appendSmallReply appends smallReply(req) to dst.
func appendSmallReply(dst, req []byte) []byte {
	for _, b := range req {
		dst = append(dst, ^b)
	}
	return dst
}

// checkSmallReply reports whether resp is smallReply(req).
func checkSmallReply(req, resp []byte) error {
	if len(resp) != len(req) {
		return fmt.Errorf("%w: small response of %d bytes, want %d", errVerify, len(resp), len(req))
	}
	for i, b := range req {
		if resp[i] != ^b {
			return fmt.Errorf("%w: small response byte %d is %#x, want %#x", errVerify, i, resp[i], ^b)
		}
	}
	return nil
}

// bulkByte is byte i of a bulk payload, for i >= 8.
func bulkByte(i int) byte { return byte(i % 251) }

// newBulkPayload returns a bulk payload of n bytes (n >= 8): an 8-byte call
// id (little-endian, see setBulkID) followed by the bytes bulkByte(i).
func newBulkPayload(n int) []byte {
	p := make([]byte, n)
	for i := 8; i < n; i++ {
		p[i] = bulkByte(i)
	}
	return p
}

// setBulkID sets the call id of payload p; the harness gives every call its
// own, which the server echoes.
func setBulkID(p []byte, id uint64) { binary.LittleEndian.PutUint64(p, id) }

// checkBulk verifies a bulk payload as a server received it: its length
// must be bulkBytes and one byte of every page (and the last byte) must
// follow the pattern. It returns the call id the server must answer with.
func checkBulk(p []byte) (id uint64, err error) {
	if len(p) != bulkBytes {
		return 0, fmt.Errorf("%w: bulk payload of %d bytes, want %d", errVerify, len(p), bulkBytes)
	}
	for i := sampleStride; i < len(p); i += sampleStride {
		if p[i] != bulkByte(i) {
			return 0, fmt.Errorf("%w: bulk payload byte %d is %d, want %d", errVerify, i, p[i], bulkByte(i))
		}
	}
	if last := len(p) - 1; p[last] != bulkByte(last) {
		return 0, fmt.Errorf("%w: bulk payload last byte is %d, want %d", errVerify, p[last], bulkByte(last))
	}
	return binary.LittleEndian.Uint64(p), nil
}

// checkBulkAck checks, on the client, that the server answered payload with
// its call id.
func checkBulkAck(payload []byte, id uint64) error {
	if want := binary.LittleEndian.Uint64(payload); id != want {
		return fmt.Errorf("%w: bulk acknowledged call id %d, want %d", errVerify, id, want)
	}
	return nil
}

// streamRingLen is the number of distinct stream message buffers. Message k
// of a stream is buffer k%streamRingLen, every byte of which is
// streamTag(k). The buffers are never written after they are made, so a
// system may keep referring to a message after sending it.
const streamRingLen = 4

func streamTag(k int64) byte { return byte(k%streamRingLen) + 1 }

var streamRings struct {
	sync.Mutex
	m map[int][][]byte
}

// streamRing returns the message buffers for msgSize-byte messages, made
// once per size.
func streamRing(msgSize int) [][]byte {
	streamRings.Lock()
	defer streamRings.Unlock()
	if r, ok := streamRings.m[msgSize]; ok {
		return r
	}
	r := make([][]byte, streamRingLen)
	for k := range r {
		r[k] = bytes.Repeat([]byte{streamTag(int64(k))}, msgSize)
	}
	if streamRings.m == nil {
		streamRings.m = map[int][][]byte{}
	}
	streamRings.m[msgSize] = r
	return r
}

// sendStream calls send with the messages of a stream of total bytes in
// msgSize-byte messages, in order, and stops at the first error or when
// ctx is done. send must not modify the message.
func sendStream(ctx context.Context, total int64, msgSize int, send func(msg []byte) error) error {
	if total <= 0 || msgSize <= 0 || msgSize > maxMessage {
		return fmt.Errorf("stream of %d bytes in messages of %d bytes", total, msgSize)
	}
	ring := streamRing(msgSize)
	var k int64
	for sent := int64(0); sent < total; sent += int64(msgSize) {
		if k%64 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		n := int(min(int64(msgSize), total-sent))
		if err := send(ring[k%streamRingLen][:n]); err != nil {
			return err
		}
		k++
	}
	return nil
}

// A streamCheck verifies, on the server, the messages of one stream in the
// order they arrive: each is non-empty and as long as the first, except the
// last, which may be shorter, and its first byte, one byte per page and its
// last byte are its streamTag.
type streamCheck struct {
	msgs, bytes int64
	size        int  // the first message's length
	short       bool // a message shorter than size came: it must be the last
}

// add checks the next message.
func (s *streamCheck) add(msg []byte) error {
	switch {
	case len(msg) == 0:
		return fmt.Errorf("%w: empty stream message %d", errVerify, s.msgs)
	case s.msgs == 0:
		s.size = len(msg)
	case s.short:
		return fmt.Errorf("%w: stream message %d after a short message", errVerify, s.msgs)
	case len(msg) > s.size:
		return fmt.Errorf("%w: stream message %d of %d bytes, longer than the first (%d)", errVerify, s.msgs, len(msg), s.size)
	}
	s.short = len(msg) < s.size
	if err := checkStreamMessage(s.msgs, msg); err != nil {
		return err
	}
	s.msgs++
	s.bytes += int64(len(msg))
	return nil
}

// checkStreamMessage checks the bytes of message k of a stream, which must
// not be empty: its first byte, one byte per page and its last byte must be
// streamTag(k). Servers that may receive messages out of order call it with
// the message's number; the others use a streamCheck.
func checkStreamMessage(k int64, msg []byte) error {
	tag := streamTag(k)
	for i := 0; i < len(msg); i += sampleStride {
		if msg[i] != tag {
			return fmt.Errorf("%w: stream message %d byte %d is %d, want %d", errVerify, k, i, msg[i], tag)
		}
	}
	if msg[len(msg)-1] != tag {
		return fmt.Errorf("%w: stream message %d last byte is %d, want %d", errVerify, k, msg[len(msg)-1], tag)
	}
	return nil
}

// total returns the bytes of the messages checked so far.
func (s *streamCheck) total() int64 { return s.bytes }

// checkStreamAck checks, on the client, that the server acknowledged all
// total bytes of a stream.
func checkStreamAck(total, acked int64) error {
	if acked != total {
		return fmt.Errorf("%w: server acknowledged %d stream bytes, sent %d", errVerify, acked, total)
	}
	return nil
}
