package rpc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sharing is how much of a node's root a connection's two sides share,
// decided at the handshake (docs/protocol.md, "Sharing"). It orders: None <
// Storage < Coherent.
//
// A shared filesystem shares bytes, not mappings: NFS promises
// close-to-open consistency only, and CephFS and GPFS do not make one
// machine's stores through a mapping visible in another machine's mapping.
// So references to files that someone changes in place (replay's storage,
// the loader's ring, serve's slots, rpc Fill and Read) are safe only at
// Coherent; write-once files (store versions, read-only datasets: written,
// synced, renamed into place, opened after, never rewritten) are safe at
// Storage too.
type Sharing uint8

const (
	// None: the sides do not see the same files (no root on one side,
	// another filesystem, or a copy of the root). Everything travels as
	// bytes.
	None Sharing = 0
	// Storage: the sides see the same files through different page caches
	// (two machines on NFS, two FUSE mounts of one folder). Write-once
	// files may go by reference; everything changed in place goes as bytes.
	Storage Sharing = 1
	// Coherent: the sides run on one kernel and their roots are one mount,
	// so they share one page cache and every mapping sees every store at
	// once; or both opted in to WithCoherentStorage and their filesystem
	// passed its probe. Everything under the root may go by reference.
	Coherent Sharing = 2
)

// String returns "none", "storage" or "coherent".
func (s Sharing) String() string {
	switch s {
	case None:
		return "none"
	case Storage:
		return "storage"
	case Coherent:
		return "coherent"
	}
	return fmt.Sprintf("sharing(%d)", uint8(s))
}

// sharingVersion is the first protocol version whose handshake decides
// Sharing (the where messages). Older peers are judged by their filesystem
// identity alone, as those versions did.
const sharingVersion = 4

// ProbeDir is the folder, at the top of a node's root, where the node
// leaves a probe file for each connecting client to read through its own
// root (docs/protocol.md, "Sharing"). Probes live for one handshake.
const ProbeDir = ".tensorwire-probe"

// hostID is what one side tells the other of where its root is: the kernel
// it runs on and the mount its root is on.
type hostID struct {
	boot [16]byte // /proc/sys/kernel/random/boot_id; zero where unknown
	dev  uint64   // device of the root's FSIDFile; zero without a root
	ino  uint64   // its inode
}

// localHostID returns this process's hostID for root (abs, resolved), or
// only the boot id without one.
func localHostID(root string) hostID {
	h := hostID{boot: bootID()}
	if root == "" {
		return h
	}
	if fi, err := os.Stat(filepath.Join(root, FSIDFile)); err == nil {
		if id, ok := fileIDOf(fi); ok {
			h.dev, h.ino = id.dev, id.ino
		}
	}
	return h
}

// bootID reads the kernel's boot id, a random UUID fresh at each boot and
// the same in every container and network namespace of that kernel. Zero
// where there is none (not Linux): such a side is never Coherent with
// another process, whatever else agrees.
func bootID() [16]byte {
	var id [16]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id
	}
	s := strings.ReplaceAll(strings.TrimSpace(string(b)), "-", "")
	if n, err := hex.Decode(id[:], []byte(s)); err != nil || n != len(id) {
		return [16]byte{}
	}
	return id
}

// The where messages (version 4, main connections only) follow the session
// message: the server sends serverWhere, the client answers with
// clientWhere, and both then know the connection's Sharing.
//
// serverWhere, 48 bytes:
//
//	 0 16 boot id of the node's kernel; zero where unknown
//	16  8 device of the node root's FSIDFile; zero without a root
//	24  8 its inode
//	32 16 probe: the name, in hex, of the file the node made under
//	      ProbeDir for this connection; zero: none (no root on either
//	      side, or the identities differ)
//
// clientWhere, 40 bytes:
//
//	 0 16 boot id of the client's kernel
//	16  8 device and inode of the client root's FSIDFile, as above
//	32  1 the level the client decided: 0 none, 1 storage, 2 coherent
//	33  7 reserved, zero
const (
	serverWhereSize = 48
	clientWhereSize = 40
)

type serverWhere struct {
	host  hostID
	probe [16]byte
}

type clientWhere struct {
	host  hostID
	level Sharing
}

func (h hostID) put(b []byte) {
	copy(b[0:16], h.boot[:])
	binary.BigEndian.PutUint64(b[16:24], h.dev)
	binary.BigEndian.PutUint64(b[24:32], h.ino)
}

func getHostID(b []byte) hostID {
	var h hostID
	copy(h.boot[:], b[0:16])
	h.dev = binary.BigEndian.Uint64(b[16:24])
	h.ino = binary.BigEndian.Uint64(b[24:32])
	return h
}

func (w serverWhere) marshal() []byte {
	b := make([]byte, serverWhereSize)
	w.host.put(b)
	copy(b[32:48], w.probe[:])
	return b
}

func parseServerWhere(b []byte) (serverWhere, error) {
	if len(b) != serverWhereSize {
		return serverWhere{}, fmt.Errorf("%w: where message of %d bytes", errHandshake, len(b))
	}
	w := serverWhere{host: getHostID(b)}
	copy(w.probe[:], b[32:48])
	return w, nil
}

func (w clientWhere) marshal() []byte {
	b := make([]byte, clientWhereSize)
	w.host.put(b)
	b[32] = byte(w.level)
	return b
}

func parseClientWhere(b []byte) (clientWhere, error) {
	if len(b) != clientWhereSize {
		return clientWhere{}, fmt.Errorf("%w: where message of %d bytes", errHandshake, len(b))
	}
	w := clientWhere{host: getHostID(b), level: Sharing(b[32])}
	if w.level > Coherent || binary.BigEndian.Uint64(b[32:40])&^(0xff<<56) != 0 {
		return clientWhere{}, fmt.Errorf("%w: reserved bits set in the where message", errHandshake)
	}
	return w, nil
}

// decideSharing returns the level two sides share given whether the client
// read the node's probe through its own root, and the two sides' hostIDs,
// with a reason a person can act on. Both sides run it on the same facts.
func decideSharing(probed bool, node, client hostID) (Sharing, string) {
	if !probed {
		return None, "the client's root does not hold the node's probe file: not the node's root (another folder, or a copy of it)"
	}
	switch {
	case node.boot == [16]byte{} || client.boot == [16]byte{}:
		return Storage, "the same files; a side cannot tell its kernel (no boot id), so mappings are not assumed coherent"
	case node.boot != client.boot:
		return Storage, "the same files from another machine (boot ids differ): another page cache, so only write-once files go by reference"
	case node.dev == 0 || node.dev != client.dev || node.ino != client.ino:
		return Storage, fmt.Sprintf("the same files through another mount (device/inode %d/%d here, %d/%d at the node): another page cache, so only write-once files go by reference", client.dev, client.ino, node.dev, node.ino)
	}
	return Coherent, "one kernel and one mount: one page cache"
}

// legacySharing is the level of a peer older than sharingVersion: equal
// identities were taken as shared, which was right on one host only.
func legacySharing(mine, theirs FSID) Sharing {
	if !mine.IsZero() && mine == theirs {
		return Coherent
	}
	return None
}

func legacyWhy(version uint8) string {
	return fmt.Sprintf("protocol version %d: equal root identities are taken for one page cache", version)
}

// probeFile is a node's probe for one connection: a file under ProbeDir
// that the client must read through its own root.
type probeFile struct {
	name [16]byte
	path string
}

// makeProbe creates a fresh probe file under root. It is empty: its random
// name is the proof, and an empty file can still be made on a full disk,
// where a node's clients would otherwise all fall back to bytes.
func makeProbe(root string) (*probeFile, error) {
	var p probeFile
	if _, err := rand.Read(p.name[:]); err != nil {
		return nil, err
	}
	dir := filepath.Join(root, ProbeDir)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	p.path = filepath.Join(dir, hex.EncodeToString(p.name[:]))
	f, err := os.OpenFile(p.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil { // close is what makes it visible to other NFS clients
		os.Remove(p.path)
		return nil, err
	}
	return &p, nil
}

func (p *probeFile) remove() {
	if p != nil {
		os.Remove(p.path)
	}
}

// readProbe reports whether root holds the probe named name, as a node
// made it: a regular file, empty.
func readProbe(root string, name [16]byte) bool {
	if root == "" || name == [16]byte{} {
		return false
	}
	fi, err := os.Lstat(filepath.Join(root, ProbeDir, hex.EncodeToString(name[:])))
	return err == nil && fi.Mode().IsRegular() && fi.Size() == 0
}

// sweepProbes removes probe files older than a minute that a node killed
// mid-handshake left behind. Best effort.
func sweepProbes(root string) {
	dir := filepath.Join(root, ProbeDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

type peerSharingKey struct{}

// peerLevel is a session's Sharing as its calls' contexts carry it: None
// until the handshake has decided (a side connection may attach before the
// node has read the client's where message), Coherent after a coherence
// probe the filesystem passed (coherence.go). It also holds that probe's
// mapping between its two steps.
type peerLevel struct {
	v       atomic.Uint32
	log     *slog.Logger  // the session's, naming the peer
	decided chan struct{} // closed once the handshake has decided the level
	once    sync.Once

	mu    sync.Mutex
	probe *heldProbe // step 1's mapping until step 2 or the session's end
	ended bool       // the session has ended: no probe is held any more
}

func newPeerLevel(log *slog.Logger) *peerLevel {
	return &peerLevel{log: log, decided: make(chan struct{})}
}

// set sets the level; the first set marks it decided.
func (l *peerLevel) set(s Sharing) {
	l.v.Store(uint32(s))
	l.once.Do(func() { close(l.decided) })
}
func (l *peerLevel) get() Sharing { return Sharing(l.v.Load()) }

// PeerSharing returns the Sharing level of the peer whose call ctx serves
// (a handler's context), and false outside a call. Services check it
// before they accept a reference to something that changes in place: a
// peer below Coherent must send bytes.
func PeerSharing(ctx context.Context) (Sharing, bool) {
	l, ok := ctx.Value(peerSharingKey{}).(*peerLevel)
	if !ok {
		return None, false
	}
	return l.get(), true
}

// RequireCoherent returns nil when the peer whose call ctx serves shares
// the node's page cache (or ctx is not a call's: an in-process caller), and
// otherwise a FailedPrecondition *Error saying that what, a reference to
// something changed in place, must come as bytes. A service checks it
// before it trusts a peer's stores through a mapping (a client of protocol
// version 4 sends bytes by itself; this stops any other from losing rows).
func RequireCoherent(ctx context.Context, what string) error {
	lv, ok := PeerSharing(ctx)
	if !ok || lv == Coherent {
		return nil
	}
	return Errorf(FailedPrecondition, "%s by reference needs one page cache, and this client shares the node's root at level %q: it must send bytes", what, lv)
}

// clientWhereExchange runs the client's side of the where messages on rw:
// it reads the node's, looks for the node's probe through root (this
// client's, resolved; "" for none) and answers with what it decided.
func clientWhereExchange(rw io.ReadWriter, root string, fsid FSID, mine hostID) (Sharing, string, error) {
	b := make([]byte, serverWhereSize)
	if _, err := io.ReadFull(rw, b); err != nil {
		return None, "", err
	}
	node, err := parseServerWhere(b)
	if err != nil {
		return None, "", err
	}
	var level Sharing
	var why string
	switch {
	case root == "":
		level, why = None, "this client has no root"
	case fsid.IsZero():
		level, why = None, "this client's root has no "+FSIDFile+": no node has made it a root"
	case node.probe == [16]byte{}:
		level, why = None, "the node made no probe: it has no root, or its root's identity (.tensorwire-fsid) is not this client's"
	default:
		level, why = decideSharing(readProbe(root, node.probe), node.host, mine)
	}
	if _, err := rw.Write(clientWhere{host: mine, level: level}.marshal()); err != nil {
		return None, "", err
	}
	return level, why, nil
}

// serverWhereExchange runs the node's side of the where messages on rw: it
// makes a probe under root when the client's identity is the node's, sends
// its where message, reads the client's, and removes the probe. The level
// is the client's, capped by what the node can check itself (its kernel
// and mount against the client's).
func serverWhereExchange(rw io.ReadWriter, root string, mine hostID, fsid, theirs FSID) (Sharing, string, error) {
	var probe *probeFile
	var why string
	switch {
	case root == "" || fsid.IsZero():
		why = "this node has no root"
	case theirs != fsid:
		why = "the client's root identity (.tensorwire-fsid) is not this node's"
		if theirs.IsZero() {
			why = "the client has no root"
		}
	default:
		var err error
		if probe, err = makeProbe(root); err != nil {
			why = fmt.Sprintf("the node could not write its probe file: %v", err)
			probe = nil
		}
	}
	defer probe.remove()
	w := serverWhere{host: mine}
	if probe != nil {
		w.probe = probe.name
	}
	if _, err := rw.Write(w.marshal()); err != nil {
		return None, "", err
	}
	b := make([]byte, clientWhereSize)
	if _, err := io.ReadFull(rw, b); err != nil {
		return None, "", err
	}
	cw, err := parseClientWhere(b)
	if err != nil {
		return None, "", err
	}
	if probe == nil {
		return None, why, nil
	}
	most, why := decideSharing(true, mine, cw.host)
	if cw.level < most {
		if cw.level == None {
			return None, "the client's root does not hold the node's probe file: not the node's root (another folder, or a copy of it)", nil
		}
		return cw.level, fmt.Sprintf("the client found %s where the node would allow %s", cw.level, most), nil
	}
	return most, why, nil
}

// resolverFor returns the resolver of references in the arguments of a
// peer at level l: none below Coherent. A reference names a file both sides
// map; the node would read or write it through its own page cache, which a
// peer on another one does not see (a Fill by reference from another
// machine left the rows unwritten there). A client of this version sends
// bytes by itself; this refuses any other's references.
func (s *Server) resolverFor(l *peerLevel) *resolver {
	if l != nil && l.get() < Coherent {
		return nil
	}
	return s.res
}
