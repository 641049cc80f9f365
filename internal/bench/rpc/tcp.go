package rpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
)

// The raw-TCP baseline: the least a program can do to move the workloads'
// bytes over loopback TCP, with the servers' verification and nothing else.
//
// A connection serves one workload, named by the first byte the client
// sends (kindSmall, kindBulk or kindStream); then, repeatedly:
//
//	small   request: 16 bytes; response: smallReply, 16 bytes
//	bulk    request: uint64 length, payload; response: an ack
//	stream  uint64 length, message, ..., uint64 0; response: an ack
//
// (integers little-endian). An ack is 9 bytes, a status byte and a uint64:
// status 0, the value (the bulk call id or the stream's byte count); or
// status 1, the length of an error message that follows. A server drains a
// failed request to its end, so that the connection stays usable, except
// when the length is over maxMessage: then it acks the error and closes.
//
// The client dials connections lazily and keeps the idle ones per workload,
// so the small workload's callers use one connection each. Its calls look
// at ctx only when they dial: a call in flight ends when the server dies
// or the client is closed (the harness kills the servers on an interrupt).
type tcpSystem struct{}

func init() { register(tcpSystem{}) }

func (tcpSystem) name() string { return "tcp" }

const (
	kindSmall  byte = 's'
	kindBulk   byte = 'b'
	kindStream byte = 't'

	tcpReadBuffer = 64 << 10
	maxAckMessage = 1024
)

func (tcpSystem) serve(ctx context.Context, ln net.Listener) error {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	})
	defer stop()
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			ln.Close()
			return err
		}
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			c.Close()
			continue // Accept fails next
		}
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			tcpServeConn(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		})
	}
}

// tcpServeConn serves one connection until it fails or the client closes
// it; all its errors end the connection only.
func tcpServeConn(c net.Conn) error {
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		return err
	}
	switch kind[0] {
	case kindSmall:
		buf := make([]byte, smallSize)
		out := make([]byte, 0, smallSize)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
			out = appendSmallReply(out[:0], buf)
			if _, err := c.Write(out); err != nil {
				return err
			}
		}
	case kindBulk:
		r := bufio.NewReaderSize(c, tcpReadBuffer)
		var buf []byte
		for {
			n, err := tcpReadLen(r)
			if err != nil {
				writeAck(c, 0, err)
				return err
			}
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			buf = buf[:n]
			if _, err := io.ReadFull(r, buf); err != nil {
				return err
			}
			id, err := checkBulk(buf)
			if err := writeAck(c, id, err); err != nil {
				return err
			}
		}
	case kindStream:
		r := bufio.NewReaderSize(c, tcpReadBuffer)
		var buf []byte
		for {
			var check streamCheck
			var fail error
			for {
				n, err := tcpReadLen(r)
				if err != nil {
					writeAck(c, 0, err)
					return err
				}
				if n == 0 {
					break
				}
				if cap(buf) < n {
					buf = make([]byte, n)
				}
				buf = buf[:n]
				if _, err := io.ReadFull(r, buf); err != nil {
					return err
				}
				if fail == nil {
					fail = check.add(buf)
				}
			}
			if err := writeAck(c, uint64(check.total()), fail); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("tcp: unknown connection kind %q", kind[0])
	}
}

// tcpReadLen reads a length prefix; a length over maxMessage is an error.
func tcpReadLen(r io.Reader) (int, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	n := binary.LittleEndian.Uint64(b[:])
	if n > maxMessage {
		return 0, fmt.Errorf("tcp: message of %d bytes, over the limit of %d", n, maxMessage)
	}
	return int(n), nil
}

// writeAck writes an ack of v, or of err if it is not nil.
func writeAck(w io.Writer, v uint64, err error) error {
	var b []byte
	if err == nil {
		b = make([]byte, 9)
		binary.LittleEndian.PutUint64(b[1:], v)
	} else {
		msg := err.Error()
		msg = msg[:min(len(msg), maxAckMessage)]
		b = make([]byte, 9, 9+len(msg))
		b[0] = 1
		binary.LittleEndian.PutUint64(b[1:], uint64(len(msg)))
		b = append(b, msg...)
	}
	_, err = w.Write(b)
	return err
}

// errTCPServer is an error a tcp server acknowledged.
type errTCPServer string

func (e errTCPServer) Error() string { return "tcp server: " + string(e) }

// readAck reads an ack: its value, or the server's error.
func readAck(r io.Reader) (uint64, error) {
	var b [9]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("tcp: reading the ack: %w", err)
	}
	v := binary.LittleEndian.Uint64(b[1:])
	switch {
	case b[0] == 0:
		return v, nil
	case b[0] == 1 && v <= maxAckMessage:
		msg := make([]byte, v)
		if _, err := io.ReadFull(r, msg); err != nil {
			return 0, fmt.Errorf("tcp: reading the ack: %w", err)
		}
		return 0, errTCPServer(msg)
	default:
		return 0, fmt.Errorf("tcp: malformed ack %x", b)
	}
}

type tcpClient struct {
	addr   string
	dialer net.Dialer

	mu     sync.Mutex
	idle   map[byte][]net.Conn // by kind
	all    map[net.Conn]struct{}
	closed bool
}

func (tcpSystem) dial(ctx context.Context, addr string) (client, error) {
	c := &tcpClient{addr: addr, idle: map[byte][]net.Conn{}, all: map[net.Conn]struct{}{}}
	// Fail now if the server is not there; keep the connection for bulk.
	conn, err := c.get(ctx, kindBulk)
	if err != nil {
		return nil, err
	}
	c.put(kindBulk, conn)
	return c, nil
}

// get returns an idle connection of the kind, or a new one.
func (c *tcpClient) get(ctx context.Context, kind byte) (net.Conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, net.ErrClosed
	}
	if idle := c.idle[kind]; len(idle) > 0 {
		conn := idle[len(idle)-1]
		c.idle[kind] = idle[:len(idle)-1]
		c.mu.Unlock()
		return conn, nil
	}
	c.mu.Unlock()
	conn, err := c.dialer.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte{kind}); err != nil {
		conn.Close()
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		conn.Close()
		return nil, net.ErrClosed
	}
	c.all[conn] = struct{}{}
	return conn, nil
}

// put makes conn idle again.
func (c *tcpClient) put(kind byte, conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle[kind] = append(c.idle[kind], conn)
}

// drop closes conn, which failed: its state is unknown.
func (c *tcpClient) drop(conn net.Conn) {
	c.mu.Lock()
	delete(c.all, conn)
	c.mu.Unlock()
	conn.Close()
}

// Close closes every connection, busy ones included.
func (c *tcpClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for conn := range c.all {
		conn.Close()
	}
	clear(c.all)
	clear(c.idle)
	return nil
}

func (c *tcpClient) small(ctx context.Context, req []byte) ([]byte, error) {
	if len(req) != smallSize {
		return nil, fmt.Errorf("tcp: small request of %d bytes, want %d", len(req), smallSize)
	}
	conn, err := c.get(ctx, kindSmall)
	if err != nil {
		return nil, err
	}
	resp := make([]byte, smallSize)
	if _, err := conn.Write(req); err != nil {
		c.drop(conn)
		return nil, err
	}
	if _, err := io.ReadFull(conn, resp); err != nil {
		c.drop(conn)
		return nil, err
	}
	c.put(kindSmall, conn)
	return resp, nil
}

func (c *tcpClient) bulk(ctx context.Context, payload []byte) error {
	conn, err := c.get(ctx, kindBulk)
	if err != nil {
		return err
	}
	hdr := make([]byte, 8)
	binary.LittleEndian.PutUint64(hdr, uint64(len(payload)))
	bufs := net.Buffers{hdr, payload} // one writev
	if _, err := bufs.WriteTo(conn); err != nil {
		c.drop(conn)
		return err
	}
	id, err := readAck(conn)
	if err != nil {
		c.drop(conn)
		return err
	}
	c.put(kindBulk, conn)
	return checkBulkAck(payload, id)
}

func (c *tcpClient) stream(ctx context.Context, total int64, msgSize int) error {
	conn, err := c.get(ctx, kindStream)
	if err != nil {
		return err
	}
	hdr := make([]byte, 8)
	err = sendStream(ctx, total, msgSize, func(msg []byte) error {
		binary.LittleEndian.PutUint64(hdr, uint64(len(msg)))
		bufs := net.Buffers{hdr, msg}
		_, err := bufs.WriteTo(conn)
		return err
	})
	if err == nil {
		clear(hdr) // the end
		_, err = conn.Write(hdr)
	}
	var acked uint64
	if err == nil {
		acked, err = readAck(conn)
	}
	if err != nil {
		c.drop(conn)
		return err
	}
	c.put(kindStream, conn)
	return checkStreamAck(total, int64(acked))
}
