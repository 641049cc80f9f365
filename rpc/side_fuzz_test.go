package rpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// FuzzAttach feeds a node's handshake a side connection's attach message
// after a well-formed version 3 hello with the attach flag: the decoder
// never panics, refuses malformed bytes with errHandshake and nothing
// written after the hello, round-trips what it accepts, and the node
// attaches a connection only with the session's secret (anything else is
// refused with a status); the session message decodes the same way.
func FuzzAttach(f *testing.F) {
	var secret [32]byte
	for i := range secret {
		secret[i] = byte(i) + 1
	}
	f.Add(attachMsg{id: 1, secret: secret}.marshal())
	f.Add(attachMsg{id: 0xffffffff}.marshal())
	f.Add(make([]byte, attachSize))
	f.Add(append(attachMsg{id: 9, secret: secret}.marshal(), 1))
	f.Add([]byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, perr := parseAttach(in)
		if perr != nil {
			if !errors.Is(perr, errHandshake) {
				t.Fatalf("parseAttach error %v does not wrap errHandshake", perr)
			}
		} else if a.id == 0 || !bytes.Equal(a.marshal(), in) {
			t.Fatalf("parseAttach(%x) = %+v", in, a)
		}
		if m, err := parseSession(in); err == nil && !bytes.Equal(m.marshal(), in) {
			t.Fatalf("parseSession(%x) = %+v", in, m)
		} else if err != nil && !errors.Is(err, errHandshake) {
			t.Fatalf("parseSession error %v does not wrap errHandshake", err)
		}

		// The handshake reads the message's 40 bytes; what follows is the
		// connection's.
		a, perr = parseAttach(in[:min(len(in), attachSize)])
		h, err := newHelloVersion(sideVersion, FSID{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.flags |= flagAttach
		c := &fakeConn{r: bytes.NewReader(append(h.marshal(), in...))}
		var got *attachMsg
		offer := &sideOffer{attach: func(m attachMsg) error {
			if m.secret != secret {
				return Errorf(Unauthenticated, "no session has this secret")
			}
			got = &m
			return nil
		}}
		peer, herr := serverHandshakeSide(c, ProtocolVersion, rootSide{}, nil, offer)
		out := c.w.Bytes()
		if len(out) < helloSize {
			t.Fatalf("wrote %d bytes, not a hello", len(out))
		}
		rest := out[helloSize:]
		switch {
		case len(in) < attachSize:
			if herr == nil || len(rest) != 0 {
				t.Fatalf("a short attach message: %v, wrote %x", herr, rest)
			}
		case perr != nil:
			if !errors.Is(herr, errHandshake) || len(rest) != 0 {
				t.Fatalf("a malformed attach message: %v, wrote %x", herr, rest)
			}
		case a.secret != secret:
			if !errors.Is(herr, ErrUnauthenticated) || readStatus(bytes.NewReader(rest)) == nil {
				t.Fatalf("a wrong secret: %v, wrote %x", herr, rest)
			}
		default:
			if herr != nil || !peer.attach || got == nil || *got != a || !bytes.Equal(rest, []byte{0}) {
				t.Fatalf("the session's secret: %v, %+v, wrote %x", herr, peer, rest)
			}
		}
	})
}

// FuzzSideRequest feeds a node's side connection what a caller may send
// on it: a call's request (tag, header, argument, body), a message stream's
// frame, or garbage. The node never panics, never blocks past the
// connection's end, and holds no side connection once the peer is gone; a
// well-formed call is answered there.
func FuzzSideRequest(f *testing.F) {
	l := hostileLimits()
	l.TransferGrace = 20 * time.Millisecond
	s, err := NewServer(WithLimits(l), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	if err := Register(s, methodEcho, func(ctx context.Context, m echoMsg) (echoMsg, error) { return m, nil }); err != nil {
		f.Fatal(err)
	}
	call := func(hdr requestHeader, args []byte, tail ...byte) []byte {
		hdr.ArgLen = int64(len(args))
		b := append([]byte{sideCallTag}, frameOf(f, &hdr)...)
		return append(append(b, args...), tail...)
	}
	args, err := encodeMsgpack(echoMsg{S: "hi"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(call(requestHeader{Method: methodEcho}, args))
	f.Add(call(requestHeader{Method: methodEcho, BodyLen: 3}, args, 1, 2, 3))
	f.Add(call(requestHeader{Method: methodEcho, BodyLen: 3, RawLen: 9}, args, 1, 2, 3))
	f.Add(call(requestHeader{Method: "tensorwire.describe"}, args))
	f.Add(append(call(requestHeader{Method: methodEcho}, args), call(requestHeader{Method: methodEcho}, args)...))
	f.Add(call(requestHeader{Method: methodEcho, Stream: true}, args))
	f.Add(frameOf(f, &requestHeader{Method: methodEcho}))
	f.Add([]byte{sideCallTag, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{sideCallTag})
	f.Fuzz(func(t *testing.T, in []byte) {
		set := newSideSet(s, s.o.log, 1)
		a, b := net.Pipe()
		sc, err := set.add(1, a)
		if err != nil {
			t.Fatal(err)
		}
		set.start(sc)
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			io.Copy(io.Discard, b)
		}()
		b.SetWriteDeadline(time.Now().Add(10 * time.Second))
		b.Write(in)
		b.Close()
		<-drained
		waitFor(t, "the side connection closed", func() bool { return set.len() == 0 })
		set.close()
		s.wg.Wait() // the connection's reader and its calls have returned
	})
}
