package rpc

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The handshake runs on a new connection (inside TLS when configured) before
// yamux starts. docs/protocol.md describes it; golden tests pin its bytes.
const (
	magic = "TWRP"
	// ProtocolVersion is the newest version of the protocol this package
	// speaks: 4. Version 2 adds message streams and lz4-compressed bodies
	// to version 1; version 3 adds side connections for bulk bodies
	// (side.go); version 4 adds the where messages that decide a
	// connection's Sharing (sharing.go). It still speaks the older versions
	// with peers that speak only those (docs/protocol.md, "Versioning").
	ProtocolVersion    = 4
	minProtocolVersion = 1 // the oldest version this package speaks
	helloSize          = 64
	proofSize          = sha256.Size
	maxStatusMsg       = 1024
)

// Flags in a hello.
const (
	flagToken  = 1 << 0 // the sender has a token and will authenticate
	flagAttach = 1 << 1 // version 3, a client's: the connection attaches to a session as a side connection
)

// sideVersion is the first protocol version with side connections.
const sideVersion = 3

var (
	clientProofLabel = []byte("tensorwire client proof")
	serverProofLabel = []byte("tensorwire server proof")
)

// errHandshake marks malformed handshake bytes: a peer that does not speak
// the protocol. Servers close such connections without a reply.
var errHandshake = errors.New("rpc: malformed handshake")

// hello is the first message each side sends: 64 bytes,
//
//	0  4  magic "TWRP"
//	4  1  protocol version
//	5  1  flags (bit 0: the sender has a token; bit 1, version 3: a side connection)
//	6  2  reserved, zero
//	8 32  nonce, random
//	40 16 filesystem identity (zero: no shared root)
//	56 8  reserved, zero
type hello struct {
	version uint8
	flags   uint8
	nonce   [32]byte
	fsid    FSID
}

// speaks reports whether this package speaks protocol version v.
func speaks(v uint8) bool { return v >= minProtocolVersion && v <= ProtocolVersion }

// newHello returns a hello of the newest version.
func newHello(fsid FSID, token []byte) (hello, error) {
	return newHelloVersion(ProtocolVersion, fsid, token)
}

func newHelloVersion(version uint8, fsid FSID, token []byte) (hello, error) {
	h := hello{version: version, fsid: fsid}
	if len(token) > 0 {
		h.flags |= flagToken
	}
	if _, err := rand.Read(h.nonce[:]); err != nil {
		return h, fmt.Errorf("rpc: nonce: %w", err)
	}
	return h, nil
}

func (h hello) marshal() []byte {
	b := make([]byte, helloSize)
	copy(b, magic)
	b[4] = h.version
	b[5] = h.flags
	copy(b[8:40], h.nonce[:])
	copy(b[40:56], h.fsid[:])
	return b
}

// parseHello decodes a hello. It accepts any version (the caller decides
// what to do about it) and refuses a wrong magic, unknown flags or nonzero
// reserved bytes, so that the reserved space can be given meaning later;
// the attach flag is unknown before version 3.
func parseHello(b []byte) (hello, error) {
	var h hello
	if len(b) != helloSize || string(b[:4]) != magic {
		return h, fmt.Errorf("%w: bad magic", errHandshake)
	}
	h.version, h.flags = b[4], b[5]
	known := uint8(flagToken)
	if h.version >= sideVersion {
		known |= flagAttach
	}
	if h.flags&^known != 0 || b[6] != 0 || b[7] != 0 || binary.BigEndian.Uint64(b[56:]) != 0 {
		return h, fmt.Errorf("%w: reserved bits set", errHandshake)
	}
	copy(h.nonce[:], b[8:40])
	copy(h.fsid[:], b[40:56])
	return h, nil
}

// proof returns the HMAC-SHA256 under token of label and both hellos: it
// shows the sender knows the token without sending it, and binds the proof
// to this connection's nonces and filesystem identities.
func proof(token []byte, label, client, server []byte) []byte {
	m := hmac.New(sha256.New, token)
	m.Write(label)
	m.Write(client)
	m.Write(server)
	return m.Sum(nil)
}

// writeStatus writes the server's verdict: a code byte, and for a refusal a
// big-endian uint16 length and a message.
func writeStatus(w io.Writer, code Code, msg string) error {
	if code == OK {
		_, err := w.Write([]byte{0})
		return err
	}
	if len(msg) > maxStatusMsg {
		msg = msg[:maxStatusMsg]
	}
	b := make([]byte, 3+len(msg))
	b[0] = byte(code)
	binary.BigEndian.PutUint16(b[1:], uint16(len(msg)))
	copy(b[3:], msg)
	_, err := w.Write(b)
	return err
}

// readStatus reads a verdict; a refusal comes back as an *Error.
func readStatus(r io.Reader) error {
	var b [3]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return err
	}
	if b[0] == 0 {
		return nil
	}
	if _, err := io.ReadFull(r, b[1:3]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint16(b[1:])
	if n > maxStatusMsg {
		return fmt.Errorf("%w: status message of %d bytes", errHandshake, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return err
	}
	return &Error{Code: Code(b[0]), Msg: string(msg)}
}

// peerInfo is what a handshake learns about the other side.
type peerInfo struct {
	fsid    FSID
	version uint8 // the version the connection speaks
	sharing Sharing
	why     string // why sharing is what it is, for a person

	session sessionMsg // a client's, of a version 3 main connection: how to attach side connections
	attach  bool       // a server's: the connection attached as a side connection
}

// versionError is a server's refusal of the client's protocol version by a
// server that speaks an older one the client also speaks: the client dials
// again with that version.
type versionError struct {
	version uint8 // the server's
	err     error // its refusal
}

func (e *versionError) Error() string { return e.err.Error() }
func (e *versionError) Unwrap() error { return e.err }

// rootSide is what one side brings to a handshake of its root: its identity,
// its path (absolute, resolved; "" without one) and where it lies.
type rootSide struct {
	fsid FSID
	root string
	host hostID
}

// clientHandshake runs the client's side on rw with the newest version.
func clientHandshake(rw io.ReadWriter, me rootSide, token []byte) (peerInfo, error) {
	return clientHandshakeVersion(rw, ProtocolVersion, me, token)
}

// clientHandshakeVersion runs the client's side of a main connection on rw,
// offering version.
func clientHandshakeVersion(rw io.ReadWriter, version uint8, me rootSide, token []byte) (peerInfo, error) {
	return clientHandshakeAttach(rw, version, me, token, nil)
}

// clientHandshakeAttach runs the client's side on rw, offering version;
// with att (version 3), the connection attaches to the session att names
// as a side connection. It returns an *Error with code Unauthenticated
// when either side fails to authenticate the other (the node's refusal of
// an attach is an *Error too), and a *versionError when the server refused
// the version and speaks an older one this package speaks too.
func clientHandshakeAttach(rw io.ReadWriter, version uint8, me rootSide, token []byte, att *attachMsg) (peerInfo, error) {
	mine, err := newHelloVersion(version, me.fsid, token)
	if err != nil {
		return peerInfo{}, err
	}
	if att != nil {
		if version < sideVersion {
			return peerInfo{}, fmt.Errorf("rpc: a side connection in protocol version %d", version)
		}
		mine.flags |= flagAttach
	}
	cb := mine.marshal()
	if _, err := rw.Write(cb); err != nil {
		return peerInfo{}, err
	}
	sb := make([]byte, helloSize)
	if _, err := io.ReadFull(rw, sb); err != nil {
		return peerInfo{}, err
	}
	theirs, err := parseHello(sb)
	if err != nil {
		return peerInfo{}, err
	}
	if theirs.flags&flagAttach != 0 {
		return peerInfo{}, fmt.Errorf("%w: the server's hello has the attach flag", errHandshake)
	}
	auth := mine.flags&flagToken != 0
	// A server answers in the client's version when it speaks it; one that
	// answers in another refuses the client's before reading a proof.
	sameVersion := theirs.version == mine.version
	if auth && sameVersion && theirs.flags&flagToken != 0 {
		if _, err := rw.Write(proof(token, clientProofLabel, cb, sb)); err != nil {
			return peerInfo{}, err
		}
	}
	if att != nil && sameVersion {
		if _, err := rw.Write(att.marshal()); err != nil {
			return peerInfo{}, err
		}
	}
	if err := readStatus(rw); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == FailedPrecondition && theirs.version < mine.version && speaks(theirs.version) {
			return peerInfo{}, &versionError{version: theirs.version, err: err}
		}
		return peerInfo{}, err
	}
	if !sameVersion {
		return peerInfo{}, fmt.Errorf("%w: the server accepted version %d in a hello of version %d", errHandshake, mine.version, theirs.version)
	}
	if auth {
		if theirs.flags&flagToken == 0 {
			return peerInfo{}, Errorf(Unauthenticated, "server has no token and cannot prove who it is")
		}
		got := make([]byte, proofSize)
		if _, err := io.ReadFull(rw, got); err != nil {
			return peerInfo{}, err
		}
		if !hmac.Equal(got, proof(token, serverProofLabel, cb, sb)) {
			return peerInfo{}, Errorf(Unauthenticated, "server does not know the token")
		}
	}
	info := peerInfo{fsid: theirs.fsid, version: mine.version}
	if mine.version >= sideVersion && att == nil {
		b := make([]byte, sessionSize)
		if _, err := io.ReadFull(rw, b); err != nil {
			return peerInfo{}, err
		}
		if info.session, err = parseSession(b); err != nil {
			return peerInfo{}, err
		}
	}
	info.sharing, info.why = legacySharing(me.fsid, theirs.fsid), legacyWhy(mine.version)
	if mine.version >= sharingVersion && att == nil {
		if info.sharing, info.why, err = clientWhereExchange(rw, me.root, me.fsid, me.host); err != nil {
			return peerInfo{}, err
		}
	}
	return info, nil
}

// serverHandshake runs the server's side on rw, speaking every version
// this package speaks, without side connections.
func serverHandshake(rw io.ReadWriter, me rootSide, token []byte) (peerInfo, error) {
	return serverHandshakeUpTo(rw, ProtocolVersion, me, token)
}

// serverHandshakeUpTo runs the server's side on rw, speaking versions up to
// newest (tests play older nodes with it), without side connections: a
// version 3 session gets none, and a side connection is refused.
func serverHandshakeUpTo(rw io.ReadWriter, newest uint8, me rootSide, token []byte) (peerInfo, error) {
	return serverHandshakeSide(rw, newest, me, token, nil)
}

// sideOffer is what a server's handshake offers of side connections
// (side.go).
type sideOffer struct {
	// session returns the session message of a version 3 main connection
	// (registering its secret); nil, or a zero secret, offers none.
	session func() (sessionMsg, error)
	// attach attaches a side connection to the session a names, or returns
	// the refusal (an *Error); it runs after the client has authenticated,
	// before the verdict. nil refuses side connections.
	attach func(a attachMsg) error
}

// serverHandshakeSide runs the server's side on rw, speaking versions up to
// newest, with side connections as offer says (nil: none). A refusal it
// could explain is written to the peer and returned as an *Error;
// malformed bytes return an error wrapping errHandshake with nothing
// written after the hello. The server reads everything the client sends
// before its verdict (a proof, an attach message) before refusing, so that
// the client reads the refusal rather than a reset connection.
func serverHandshakeSide(rw io.ReadWriter, newest uint8, me rootSide, token []byte, offer *sideOffer) (peerInfo, error) {
	cb := make([]byte, helloSize)
	if _, err := io.ReadFull(rw, cb); err != nil {
		return peerInfo{}, err
	}
	theirs, err := parseHello(cb)
	if err != nil {
		return peerInfo{}, err
	}
	// Answer in the client's version when this side speaks it, else in the
	// newest, which the refusal below names so the client can fall back.
	spoken := speaks(theirs.version) && theirs.version <= newest
	version := newest
	if spoken {
		version = theirs.version
	}
	mine, err := newHelloVersion(version, me.fsid, token)
	if err != nil {
		return peerInfo{}, err
	}
	sb := mine.marshal()
	if _, err := rw.Write(sb); err != nil {
		return peerInfo{}, err
	}
	refuse := func(code Code, format string, args ...any) (peerInfo, error) {
		e := Errorf(code, format, args...)
		writeStatus(rw, code, e.(*Error).Msg)
		return peerInfo{}, e
	}
	if !spoken {
		return refuse(FailedPrecondition, "client speaks protocol version %d, this node %d to %d", theirs.version, minProtocolVersion, newest)
	}
	auth := len(token) > 0
	var got []byte // the client's proof
	if auth && theirs.flags&flagToken != 0 {
		got = make([]byte, proofSize)
		if _, err := io.ReadFull(rw, got); err != nil {
			return peerInfo{}, err
		}
	}
	attaching := theirs.flags&flagAttach != 0
	var att attachMsg
	if attaching {
		b := make([]byte, attachSize)
		if _, err := io.ReadFull(rw, b); err != nil {
			return peerInfo{}, err
		}
		if att, err = parseAttach(b); err != nil {
			return peerInfo{}, err
		}
	}
	switch {
	case auth && theirs.flags&flagToken == 0:
		return refuse(Unauthenticated, "this node requires a token")
	case !auth && theirs.flags&flagToken != 0:
		return refuse(Unauthenticated, "this node has no token; a client with one cannot authenticate it")
	case auth && !hmac.Equal(got, proof(token, clientProofLabel, cb, sb)):
		return refuse(Unauthenticated, "wrong token")
	}
	if attaching {
		if offer == nil || offer.attach == nil {
			return refuse(FailedPrecondition, "this node takes no side connections")
		}
		if err := offer.attach(att); err != nil {
			e := asError(err)
			return refuse(e.Code, "%s", e.Msg)
		}
	}
	if err := writeStatus(rw, OK, ""); err != nil {
		return peerInfo{}, err
	}
	if auth {
		if _, err := rw.Write(proof(token, serverProofLabel, cb, sb)); err != nil {
			return peerInfo{}, err
		}
	}
	if version >= sideVersion && !attaching {
		var m sessionMsg
		if offer != nil && offer.session != nil {
			if m, err = offer.session(); err != nil {
				return peerInfo{}, err
			}
		}
		if _, err := rw.Write(m.marshal()); err != nil {
			return peerInfo{}, err
		}
	}
	info := peerInfo{fsid: theirs.fsid, version: version, attach: attaching}
	info.sharing, info.why = legacySharing(me.fsid, theirs.fsid), legacyWhy(version)
	if version >= sharingVersion && !attaching {
		if info.sharing, info.why, err = serverWhereExchange(rw, me.root, me.host, me.fsid, theirs.fsid); err != nil {
			return peerInfo{}, err
		}
	}
	return info, nil
}
