package rpc

import (
	"bytes"
	"errors"
	"testing"
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
		peer, herr := serverHandshakeSide(c, ProtocolVersion, FSID{}, nil, offer)
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
