package serve

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestRemote_RegisterRefusedBelowCoherent: slots, ring and bell are
// rewritten in place by the node and the client, so a peer that does not
// share the node's page cache may not register a slots folder, even one
// that exists under the node's root; it is refused with FailedPrecondition
// and must send its rows as bytes.
func TestRemote_RegisterRefusedBelowCoherent(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 8))
	c := dial(t, n.addr, root, "ref") // makes a real slots folder
	if c.Sharing() != rpc.Coherent || !c.SharedFS() {
		t.Fatalf("a client on the node's root: sharing %v, SharedFS %v", c.Sharing(), c.SharedFS())
	}
	rel, err := filepath.Rel(root, c.dir)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rpc.Dial(ctxT(t), n.addr) // no root: Sharing None
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	_, err = rpc.Call[registerResponse](ctxT(t), rc, MethodRegister, registerRequest{Name: "model", Prefix: filepath.ToSlash(rel), Slots: c.Slots()})
	if !errors.Is(err, rpc.ErrFailedPrecondition) {
		t.Fatalf("register from a peer without the root: %v, want FailedPrecondition", err)
	}
}
