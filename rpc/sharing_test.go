package rpc

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestGolden_Version4 pins the where messages as docs/protocol.md shows
// them.
func TestGolden_Version4(t *testing.T) {
	var boot, probe [16]byte
	for i := range boot {
		boot[i], probe[i] = byte(i), 0xa0+byte(i)
	}
	sw := serverWhere{host: hostID{boot: boot, dev: 0x31, ino: 0x1234}, probe: probe}
	want := unhex(t, `000102030405060708090a0b0c0d0e0f 0000000000000031 0000000000001234 a0a1a2a3a4a5a6a7a8a9aaabacadaeaf`)
	if got := sw.marshal(); !bytes.Equal(got, want) {
		t.Fatalf("node's where\n got %x\nwant %x", got, want)
	}
	if back, err := parseServerWhere(want); err != nil || back != sw {
		t.Fatalf("parseServerWhere = %+v, %v", back, err)
	}
	cw := clientWhere{host: hostID{boot: boot, dev: 0x2c, ino: 0x1234}, level: Storage}
	want = unhex(t, `000102030405060708090a0b0c0d0e0f 000000000000002c 0000000000001234 01 00000000000000`)
	if got := cw.marshal(); !bytes.Equal(got, want) {
		t.Fatalf("client's where\n got %x\nwant %x", got, want)
	}
	if back, err := parseClientWhere(want); err != nil || back != cw {
		t.Fatalf("parseClientWhere = %+v, %v", back, err)
	}
	for _, bad := range []struct {
		at  int
		val byte
	}{{32, 3}, {33, 1}, {39, 1}} {
		b := bytes.Clone(want)
		b[bad.at] = bad.val
		if _, err := parseClientWhere(b); !errors.Is(err, errHandshake) {
			t.Errorf("byte %d = %d: %v, want errHandshake", bad.at, bad.val, err)
		}
	}
}

// TestDecideSharing is the decision table: one page cache needs one kernel
// and one mount; the same files through another cache are Storage; a root
// without the node's probe is None.
func TestDecideSharing(t *testing.T) {
	a := hostID{boot: [16]byte{1}, dev: 10, ino: 99}
	for _, tc := range []struct {
		name   string
		probed bool
		node   hostID
		client hostID
		want   Sharing
	}{
		{"one kernel, one mount", true, a, a, Coherent},
		{"a bind mount: the same device and inode", true, a, hostID{boot: a.boot, dev: 10, ino: 99}, Coherent},
		{"another machine (boot ids differ)", true, a, hostID{boot: [16]byte{2}, dev: 10, ino: 99}, Storage},
		{"another mount on one kernel (FUSE, a second NFS mount)", true, a, hostID{boot: a.boot, dev: 11, ino: 99}, Storage},
		{"another inode on the same device", true, a, hostID{boot: a.boot, dev: 10, ino: 98}, Storage},
		{"a side that cannot tell its kernel", true, hostID{dev: 10, ino: 99}, hostID{dev: 10, ino: 99}, Storage},
		{"no file ids at all", true, hostID{boot: a.boot}, hostID{boot: a.boot}, Storage},
		{"not the node's root (a copy)", false, a, a, None},
	} {
		got, why := decideSharing(tc.probed, tc.node, tc.client)
		if got != tc.want || why == "" {
			t.Errorf("%s: %v (%q), want %v", tc.name, got, why, tc.want)
		}
	}
}

// handshakePair runs both sides of a handshake over a pipe, the node with
// node and the client with client, and returns what each side decided.
func handshakePair(t *testing.T, node, client rootSide) (server, cl peerInfo) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	a.SetDeadline(time.Now().Add(10 * time.Second))
	b.SetDeadline(time.Now().Add(10 * time.Second))
	errc := make(chan error, 1)
	go func() {
		var err error
		server, err = serverHandshake(a, node, nil)
		errc <- err
	}()
	cl, err := clientHandshake(b, client, nil)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server: %v", err)
	}
	return server, cl
}

// nodeRoot makes a root with an identity and returns the node's side of it.
func nodeRoot(t *testing.T) rootSide {
	t.Helper()
	dir, id, err := openRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return rootSide{fsid: id, root: dir, host: localHostID(dir)}
}

// TestHandshake_Sharing runs the where messages with peers as a test plays
// them: the same root, the same files from another kernel or mount, a
// copy of the root, another root, none. Both sides must agree, and no
// probe file may be left behind.
func TestHandshake_Sharing(t *testing.T) {
	node := nodeRoot(t)
	copied := t.TempDir() // a copy of the node's root, as cp -a makes one
	b, err := os.ReadFile(filepath.Join(node.root, FSIDFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(copied, FSIDFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cp := rootSide{fsid: node.fsid, root: copied, host: localHostID(copied)}
	other := nodeRoot(t)
	otherKernel := node
	otherKernel.host.boot = [16]byte{0xee}
	otherMount := node
	otherMount.host.dev++
	for _, tc := range []struct {
		name   string
		client rootSide
		want   Sharing
	}{
		{"the node's root", node, Coherent},
		{"the node's root from another kernel", otherKernel, Storage},
		{"the node's root through another mount", otherMount, Storage},
		{"a copy of the node's root", cp, None},
		{"another root", other, None},
		{"no root", rootSide{host: node.host}, None},
	} {
		s, c := handshakePair(t, node, tc.client)
		if s.sharing != tc.want || c.sharing != tc.want {
			t.Errorf("%s: node decided %v (%s), client %v (%s); want %v", tc.name, s.sharing, s.why, c.sharing, c.why, tc.want)
		}
		if tc.want < Coherent && c.why == "" {
			t.Errorf("%s: no reason given", tc.name)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(node.root, ProbeDir)); len(ents) != 0 {
		t.Errorf("probe files left behind: %v", ents)
	}
}

// TestHandshake_LyingClientCapped: a client that claims Coherent from
// another kernel gets the node's Storage.
func TestHandshake_LyingClientCapped(t *testing.T) {
	node := nodeRoot(t)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	errc := make(chan error, 1)
	var got Sharing
	go func() {
		var err error
		got, _, err = serverWhereExchange(a, node.root, node.host, node.fsid, node.fsid)
		errc <- err
	}()
	buf := make([]byte, serverWhereSize)
	if _, err := b.Read(buf); err != nil {
		t.Fatal(err)
	}
	lie := clientWhere{host: hostID{boot: [16]byte{0xee}, dev: node.host.dev, ino: node.host.ino}, level: Coherent}
	if _, err := b.Write(lie.marshal()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil || got != Storage {
		t.Fatalf("node decided %v, %v; want storage", got, err)
	}
}

// TestClient_Sharing dials real servers: the client's level, SharedFS and
// the level a handler sees must agree.
func TestClient_Sharing(t *testing.T) {
	root := t.TempDir()
	s, addr := startServer(t, WithRoot(root))
	seen := make(chan Sharing, 4)
	if err := Register(s, "t.sharing", func(ctx context.Context, _ struct{}) (struct{}, error) {
		lv, ok := PeerSharing(ctx)
		if !ok {
			return struct{}{}, errors.New("no sharing in the handler's context")
		}
		seen <- lv
		return struct{}{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	copied := t.TempDir()
	b, err := os.ReadFile(filepath.Join(root, FSIDFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(copied, FSIDFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	plain := t.TempDir() // a folder no node has made a root
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []Option
		want Sharing
	}{
		{"the node's root", []Option{WithRoot(root)}, Coherent},
		{"the node's root through a symlink", []Option{WithRoot(link)}, Coherent},
		{"a copy of the root", []Option{WithRoot(copied)}, None},
		{"a folder no node has made a root", []Option{WithRoot(plain)}, None},
		{"no root", nil, None},
	} {
		c := dial(t, addr, tc.opts...)
		lv, err := c.Sharing(ctx)
		if err != nil {
			t.Fatal(err)
		}
		shared, _ := c.SharedFS(ctx)
		if lv != tc.want || shared != (tc.want == Coherent) {
			t.Errorf("%s: Sharing %v, SharedFS %v; want %v", tc.name, lv, shared, tc.want)
		}
		if _, err := Call[struct{}](ctx, c, "t.sharing", struct{}{}); err != nil {
			t.Fatal(err)
		}
		if got := <-seen; got != tc.want {
			t.Errorf("%s: the node's handler saw %v, want %v", tc.name, got, tc.want)
		}
	}
	// A client writes nothing into the folder it is given.
	if ents, err := os.ReadDir(plain); err != nil || len(ents) != 0 {
		t.Errorf("the client wrote into its root: %v, %v", ents, err)
	}
}

// TestSide_AttachWaitsForTheLevel: a client attaches side connections as
// soon as its side of the where messages is done, which may be before the
// node has set the session's level. A call on such a connection must see
// the level the handshake decided, not None (a replay sample by reference
// was refused so on a loaded machine after a node restart).
func TestSide_AttachWaitsForTheLevel(t *testing.T) {
	root := t.TempDir()
	s, addr := startServer(t, WithRoot(root))
	seen := make(chan Sharing, 1)
	type bulk struct {
		TD TD `codec:"td"`
	}
	if err := Register(s, "t.bulk", func(ctx context.Context, req bulk) (struct{}, error) {
		lv, _ := PeerSharing(ctx)
		seen <- lv
		return struct{}{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	testHookBeforeLevel = func() { time.Sleep(300 * time.Millisecond) }
	t.Cleanup(func() { testHookBeforeLevel = nil })
	c := dial(t, addr, WithRoot(root))
	td, err := tensordict.Create(filepath.Join(t.TempDir(), "x"), []int{1 << 10}, tensordict.Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{1 << 10, 1 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	before := sideWritten.Load()
	if _, err := Call[struct{}](Uncompressed(testCtx(t)), c, "t.bulk", bulk{TD: TD{TensorDict: td}}); err != nil {
		t.Fatal(err)
	}
	if sideWritten.Load() == before {
		t.Fatal("the call's body did not go on a side connection")
	}
	if got := <-seen; got != Coherent {
		t.Fatalf("a call on a side connection saw %v, want coherent", got)
	}
}

// TestServer_RefusesReferencesBelowCoherent: a peer that does not share the
// node's page cache may not send references in its arguments: the node
// would fill its own view of the file, which the peer never sees. A client
// of this version sends bytes by itself; one that sends a reference anyway
// (played here by forcing its link) gets FailedPrecondition, and the
// node's file is left as it was.
func TestServer_RefusesReferencesBelowCoherent(t *testing.T) {
	root := t.TempDir()
	_, addr := startServer(t, WithRoot(root))
	node := seedTD(t, filepath.Join(root, "d"), 4)
	if err := node.Flush(); err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", root, copied).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	c := dial(t, addr, WithRoot(copied))
	if lv, _ := c.Sharing(testCtx(t)); lv != None {
		t.Fatalf("a copy of the root: %v, want none", lv)
	}
	clientConnOf(t, c).link.shared = true // as a client that ignores the level would
	td, err := tensordict.LoadMemmap(filepath.Join(copied, "d"))
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	if err := c.Fill(testCtx(t), td, nil, 7); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("Fill by reference from a peer at none: %v, want FailedPrecondition", err)
	}
	x, err := node.Tensor("memmap")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := x.Bytes()
	if bytes.Count(b, []byte{7}) != 0 {
		t.Fatal("the node filled its own file for a peer that cannot see it")
	}
}

// TestServer_RefusesStreamMessageReferencesBelowCoherent: a message
// stream's messages are held to the rule of TestServer_RefusesReferencesBelowCoherent,
// not only its opening request: a reference in a message from a peer at
// level none is the handler's Recv error (FailedPrecondition), and the
// node's file is left as it was. It failed before the node's messages were
// decoded with resolverFor: the node mapped its own copy of the file for
// the handler, which filled it for a peer that never sees it.
func TestServer_RefusesStreamMessageReferencesBelowCoherent(t *testing.T) {
	root := t.TempDir()
	s, addr := startServer(t, WithRoot(root))
	got := make(chan error, 1)
	must(t, RegisterStream(s, "test.stream.fill", func(ctx context.Context, req Empty, st *ServerStream[tick, Empty]) error {
		m, err := st.Recv(ctx)
		if err == nil && m.X.TensorDict != nil {
			var x *tensordict.Tensor
			if x, err = m.X.Tensor("memmap"); err == nil {
				err = x.Fill([]int{0, 1, 2, 3}, 7)
			}
		}
		got <- err
		return nil
	}))
	node := seedTD(t, filepath.Join(root, "d"), 4)
	must(t, node.Flush())
	copied := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", root, copied).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	c := dial(t, addr, WithRoot(copied))
	if lv, _ := c.Sharing(testCtx(t)); lv != None {
		t.Fatalf("a copy of the root: %v, want none", lv)
	}
	clientConnOf(t, c).link.shared = true // as a client that ignores the level would
	td, err := tensordict.LoadMemmap(filepath.Join(copied, "d"))
	must(t, err)
	defer td.Close()
	ctx := testCtx(t)
	st, err := OpenStream[tick, Empty](ctx, c, "test.stream.fill", Empty{})
	must(t, err)
	defer st.Close()
	must(t, st.Send(ctx, tick{X: Ref(td)}))
	herr := <-got
	if !errors.Is(herr, ErrFailedPrecondition) {
		t.Errorf("the handler's Recv of a reference from a peer at none: %v, want FailedPrecondition", herr)
	}
	x, err := node.Tensor("memmap")
	must(t, err)
	b, _ := x.Bytes()
	if bytes.Count(b, []byte{7}) != 0 {
		t.Fatal("the node filled its own file for a peer that cannot see it")
	}
}
