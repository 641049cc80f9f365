package rpc

// Fuzz tests of message streams: their frame headers, a live server's
// stream, and a caller's stream answered by a node that sends anything.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// FuzzStreamHeader reads arbitrary bytes as a message stream's frame
// header: nothing panics, refusals are errProtocol, and a header read
// encodes to bytes that read back equal.
func FuzzStreamHeader(f *testing.F) {
	frame := func(h header) []byte {
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		if err := writeFrame(bw, h, nil); err != nil {
			f.Fatal(err)
		}
		bw.Flush()
		return buf.Bytes()
	}
	f.Add(frame(&streamHeader{ArgLen: 3, BodyLen: 1 << 20}))
	f.Add(frame(&streamHeader{ArgLen: 3, BodyLen: 100, RawLen: 1 << 20}))
	f.Add(frame(&streamHeader{End: true}))
	f.Add(frame(&streamHeader{End: true, Code: 10, Message: "expired", Reason: "replay.expired"}))
	f.Add(framed(6, []byte{0x81, 0xa3, 'e', 'n', 'd', 0x01}))
	f.Add(framed(10, []byte{0x82, 0xa3, 'e', 'n', 'd', 0xc3, 0xa1, 'x', 0x91, 0xc0}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h streamHeader
		err := readHeader(bufio.NewReader(bytes.NewReader(b)), 4<<10, &h)
		if err != nil {
			if !errors.Is(err, errProtocol) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("readHeader: %v", err)
			}
			return
		}
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		if err := writeFrame(bw, &h, nil); err != nil {
			t.Fatal(err)
		}
		bw.Flush()
		var again streamHeader
		if err := readHeader(bufio.NewReader(&buf), 1<<30, &again); err != nil || again != h {
			t.Fatalf("%+v re-encoded reads as %+v, %v", h, again, err)
		}
	})
}

// FuzzServerMessageStream opens test.stream.echo on a live server and
// sends the fuzzer's bytes as its frames (or, raw, as everything after the
// open request's header): the server answers or closes the stream
// promptly, and a panic anywhere in it would end the fuzzing process.
func FuzzServerMessageStream(f *testing.F) {
	l := DefaultLimits()
	l.HandshakeTimeout = time.Second
	l.TransferGrace = time.Second
	l.MaxArgBytes = 1 << 16
	l.MaxBodyBytes = 1 << 20
	l.MaxStreamBuffer = 1 << 16
	s, err := NewServer(WithLimits(l))
	if err != nil {
		f.Fatal(err)
	}
	registerTestStreams(f, s, &streamNode{streamStarted: make(chan struct{}, 16), streamEnded: make(chan error, 16), sendErr: make(chan error, 16)})
	ln, err := newLoopbackListener()
	if err != nil {
		f.Fatal(err)
	}
	go s.Serve(ln)
	f.Cleanup(func() { s.Close() })
	addr := ln.Addr().String()

	msg := func(h streamHeader, args, body []byte) []byte {
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		writeFrame(bw, &h, args)
		bw.Write(body)
		bw.Flush()
		return buf.Bytes()
	}
	tk, _ := encodeMsgpack(&tick{I: 3})
	bt := &wireTD{Batch: []int{2}, Entries: []wireEntry{{Key: []string{"x"}, Kind: kindTensor, DType: "uint8", Shape: []int{2, 8}}}}
	tkTD, _ := encodeMsgpack(&tick{I: 1, X: TD{wire: bt}})
	z := lz4Frame(f, make([]byte, 16))
	f.Add(false, msg(streamHeader{ArgLen: int64(len(tk))}, tk, nil))
	f.Add(false, append(msg(streamHeader{ArgLen: int64(len(tk))}, tk, nil), msg(streamHeader{End: true}, nil, nil)...))
	f.Add(false, msg(streamHeader{ArgLen: int64(len(tkTD)), BodyLen: 16}, tkTD, make([]byte, 16)))
	f.Add(false, msg(streamHeader{ArgLen: int64(len(tkTD)), BodyLen: int64(len(z)), RawLen: 16}, tkTD, z))
	f.Add(false, msg(streamHeader{ArgLen: int64(len(tkTD)), BodyLen: 5, RawLen: 16}, tkTD, []byte{1, 2, 3, 4, 5}))
	f.Add(false, msg(streamHeader{End: true, Code: 3, Message: "x"}, nil, nil))
	f.Add(true, []byte{0x80})

	var p *rawPeer
	f.Cleanup(func() {
		if p != nil {
			p.sess.Close()
		}
	})
	open, _ := encodeMsgpack(&echoMsg{N: 1})
	f.Fuzz(func(t *testing.T, raw bool, data []byte) {
		if p == nil || p.sess.IsClosed() {
			if p, err = newRawPeer(addr, nil); err != nil {
				t.Fatal(err)
			}
		}
		st, err := p.sess.OpenStream()
		if err != nil {
			t.Skip("session closed")
		}
		defer st.Close()
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		if raw {
			// The fuzzer's bytes are the open request's argument and all
			// that follows.
			writeFrame(bw, &requestHeader{Method: streamEcho, ArgLen: int64(len(open)), Stream: true}, nil)
		} else {
			writeFrame(bw, &requestHeader{Method: streamEcho, ArgLen: int64(len(open)), Stream: true}, open)
		}
		bw.Write(data)
		bw.Flush()
		st.Write(buf.Bytes())
		st.Close()
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, st); errors.Is(err, yamux.ErrTimeout) {
			t.Fatalf("the server neither ended nor closed the stream in 10 s")
		}
	})
}

// FuzzClientMessageStream plays a node that answers a caller's message
// stream with the fuzzer's bytes: the caller's Recv ends, with io.EOF or
// an *Error, and nothing panics.
func FuzzClientMessageStream(f *testing.F) {
	ln, err := newLoopbackListener()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })
	replies := make(chan []byte)
	go fakeStreamNode(ln, replies)

	msg := func(h streamHeader, args, body []byte) []byte {
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		writeFrame(bw, &h, args)
		bw.Write(body)
		bw.Flush()
		return buf.Bytes()
	}
	tk, _ := encodeMsgpack(&tick{I: 3})
	bt := &wireTD{Batch: []int{2}, Entries: []wireEntry{{Key: []string{"x"}, Kind: kindTensor, DType: "uint8", Shape: []int{2, 8}}}}
	tkTD, _ := encodeMsgpack(&tick{I: 1, X: TD{wire: bt}})
	z := lz4Frame(f, make([]byte, 16))
	end := msg(streamHeader{End: true}, nil, nil)
	f.Add(append(msg(streamHeader{ArgLen: int64(len(tk))}, tk, nil), end...))
	f.Add(append(msg(streamHeader{ArgLen: int64(len(tkTD)), BodyLen: 16}, tkTD, make([]byte, 16)), end...))
	f.Add(append(msg(streamHeader{ArgLen: int64(len(tkTD)), BodyLen: int64(len(z)), RawLen: 16}, tkTD, z), end...))
	f.Add(msg(streamHeader{End: true, Code: 10, Message: "no", Reason: "test.ticks"}, nil, nil))
	f.Add([]byte{0, 0, 0, 1, 0x80})

	c, err := Dial(context.Background(), ln.Addr().String(), WithLimits(Limits{MaxArgBytes: 1 << 16, MaxBodyBytes: 1 << 20}))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := OpenStream[Empty, tick](ctx, c, streamTicks, tickReq{})
		if err != nil {
			t.Skip(err)
		}
		defer st.Close()
		replies <- data
		for {
			_, err := st.Recv(ctx)
			if err == nil {
				continue
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Recv did not end in 10 s")
			}
			var e *Error
			if err != io.EOF && !errors.As(err, &e) {
				t.Fatalf("Recv: %v, want io.EOF or an *Error", err)
			}
			return
		}
	})
}

// fakeStreamNode accepts connections on ln, and answers each stream opened
// on them with the next reply, after reading its open request; then it
// closes the stream.
func fakeStreamNode(ln net.Listener, replies chan []byte) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			if _, err := serverHandshake(conn, rootSide{}, nil); err != nil {
				return
			}
			o := newOptions(nil)
			sess, err := yamux.Server(conn, o.yamuxConfig(false))
			if err != nil {
				return
			}
			defer sess.Close()
			for {
				st, err := sess.AcceptStream()
				if err != nil {
					return
				}
				br := bufio.NewReader(st)
				var h requestHeader
				if readHeader(br, 64<<10, &h) == nil {
					io.CopyN(io.Discard, br, h.ArgLen+h.BodyLen)
				}
				st.Write(<-replies)
				st.Close()
			}
		}()
	}
}

func newLoopbackListener() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
