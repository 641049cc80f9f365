package faulttest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/yamux"
)

// specPeer is a peer written from docs/protocol.md alone, not from package
// rpc, so the hostile scenarios can say anything the protocol lets a peer
// say, and say it wrong: the handshake by hand, then yamux, then request
// messages built from maps.

// hello returns a 64-byte hello: magic, version 1, the token flag, a fresh
// nonce, and the filesystem identity fsid (16 bytes, or nil for none).
func hello(withToken bool, fsid []byte) []byte { return helloVersion(1, withToken, fsid) }

// helloVersion is hello offering protocol version v.
func helloVersion(v byte, withToken bool, fsid []byte) []byte {
	h := make([]byte, 64)
	copy(h, "TWRP")
	h[4] = v
	if withToken {
		h[5] = 1
	}
	rand.Read(h[8:40])
	copy(h[40:56], fsid)
	return h
}

// handshake runs the client's side on conn: hello, proof when token is not
// nil, verdict, the server's proof. It returns the refusal's code and
// message when the server refuses.
func handshake(conn net.Conn, token, fsid []byte) (refused int, msg string, err error) {
	return handshakeVersion(conn, 1, token, fsid)
}

// handshakeVersion is handshake offering protocol version v.
func handshakeVersion(conn net.Conn, v byte, token, fsid []byte) (refused int, msg string, err error) {
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetDeadline(time.Time{})
	mine := helloVersion(v, token != nil, fsid)
	if _, err := conn.Write(mine); err != nil {
		return 0, "", err
	}
	theirs := make([]byte, 64)
	if _, err := io.ReadFull(conn, theirs); err != nil {
		return 0, "", fmt.Errorf("server hello: %w", err)
	}
	proof := func(label string) []byte {
		m := hmac.New(sha256.New, token)
		m.Write([]byte(label))
		m.Write(mine)
		m.Write(theirs)
		return m.Sum(nil)
	}
	if token != nil && theirs[5]&1 != 0 {
		if _, err := conn.Write(proof("tensorwire client proof")); err != nil {
			return 0, "", err
		}
	}
	var status [1]byte
	if _, err := io.ReadFull(conn, status[:]); err != nil {
		return 0, "", fmt.Errorf("verdict: %w", err)
	}
	if status[0] != 0 {
		var n [2]byte
		if _, err := io.ReadFull(conn, n[:]); err != nil {
			return int(status[0]), "", nil
		}
		m := make([]byte, binary.BigEndian.Uint16(n[:]))
		io.ReadFull(conn, m)
		return int(status[0]), string(m), nil
	}
	if token != nil && theirs[5]&1 != 0 {
		got := make([]byte, 32)
		if _, err := io.ReadFull(conn, got); err != nil {
			return 0, "", fmt.Errorf("server proof: %w", err)
		}
		if !hmac.Equal(got, proof("tensorwire server proof")) {
			return 0, "", fmt.Errorf("the server's proof is wrong")
		}
	}
	return 0, "", nil
}

// authenticated dials addr and runs the handshake with token, presenting
// the filesystem identity fsid (nil: none).
func authenticated(ctx context.Context, addr string, token, fsid []byte) (net.Conn, error) {
	return authenticatedVersion(ctx, addr, 1, token, fsid)
}

// authenticatedVersion is authenticated offering protocol version v.
func authenticatedVersion(ctx context.Context, addr string, v byte, token, fsid []byte) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	code, msg, err := handshakeVersion(conn, v, token, fsid)
	if err == nil && code != 0 {
		err = fmt.Errorf("refused: code %d %q", code, msg)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// session is authenticated, then yamux.
func session(ctx context.Context, addr string, token, fsid []byte) (*yamux.Session, error) {
	return sessionVersion(ctx, addr, 1, token, fsid)
}

// sessionVersion is session offering protocol version v.
func sessionVersion(ctx context.Context, addr string, v byte, token, fsid []byte) (*yamux.Session, error) {
	conn, err := authenticatedVersion(ctx, addr, v, token, fsid)
	if err != nil {
		return nil, err
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = false
	cfg.AcceptBacklog = 1 << 16 // its streams' SYNs unacknowledged at once: a hostile peer does not wait
	return yamux.Client(conn, cfg)
}

var mh = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true}
	h.RawToString = true
	return h
}()

func pack(v any) []byte {
	var b []byte
	if err := codec.NewEncoderBytes(&b, mh).Encode(v); err != nil {
		panic(err)
	}
	return b
}

// message frames a request: header length, header map, argument, body.
func message(method string, arg any, body []byte) []byte {
	a := pack(arg)
	hdr := pack(map[string]any{"method": method, "timeout_us": 5_000_000, "arg_len": len(a), "body_len": len(body)})
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, uint32(len(hdr)))
	b.Write(hdr)
	b.Write(a)
	b.Write(body)
	return b.Bytes()
}

// response reads a response's header and skips its argument and body,
// returning the code and message.
func response(r io.Reader) (code int, msg string, err error) {
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return 0, "", err
	}
	if n == 0 || n > 1<<16 {
		return 0, "", fmt.Errorf("response header of %d bytes", n)
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return 0, "", err
	}
	var h struct {
		Code    int    `codec:"code"`
		Message string `codec:"message"`
		ArgLen  int64  `codec:"arg_len"`
		BodyLen int64  `codec:"body_len"`
	}
	if err := codec.NewDecoderBytes(hdr, mh).Decode(&h); err != nil {
		return 0, "", err
	}
	if _, err := io.CopyN(io.Discard, r, h.ArgLen+h.BodyLen); err != nil {
		return 0, "", err
	}
	return h.Code, h.Message, nil
}

// call sends one request on a new stream of s and returns the response's
// code and message.
func call(s *yamux.Session, method string, arg any, body []byte) (int, string, error) {
	st, err := s.OpenStream()
	if err != nil {
		return 0, "", err
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := st.Write(message(method, arg, body)); err != nil {
		return 0, "", err
	}
	return response(st)
}

// refFill is a tensorwire.fill argument whose TD is one uint8 tensor of
// batch n by reference to path.
func refFill(path string, n int) map[string]any {
	return map[string]any{
		"value": 1.0,
		"src":   nil,
		"td": map[string]any{
			"batch": []int{n}, "rows": nil, "gathered": false, "out": false,
			"entries": []any{map[string]any{
				"key": []string{"x"}, "kind": "tensor", "dtype": "torch.uint8", "shape": []int{n},
				"ref": map[string]any{"path": path, "file": []int{n}, "offset": 0},
			}},
		},
	}
}
