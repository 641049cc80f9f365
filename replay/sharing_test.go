package replay

import (
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestRemote_CopyOfTheRootGoesByBytes: a client whose root is a copy of the
// node's (cp -a, the same .tensorwire-fsid) must not write its rows into
// the copy. Before protocol version 4 it took the copy for the root, the
// node acknowledged the rows, and trainers sampled the real storage's
// zeros.
func TestRemote_CopyOfTheRootGoesByBytes(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 16})
	cp := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", root, cp).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	c, err := Dial(ctxT(t), n.addr, "buf", WithRoot(cp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c.SharedFS() {
		t.Fatal("a client whose root is a copy of the node's works by reference")
	}
	if got := extend(t, c, seq(1, 9)...); len(got) != 8 {
		t.Fatalf("extend went to %v", got)
	}
	td, _, err := n.b.Sample(ctxT(t), 64)
	if err != nil {
		t.Fatal(err)
	}
	ids := rowIDs(t, td)
	for _, id := range ids {
		if id < 1 || id > 8 {
			t.Fatalf("the node sampled row id %d, not one the client wrote (ids %v)", id, ids)
		}
	}
}

// TestService_RefusesReferencesBelowCoherent: a peer that does not share the
// node's page cache may not commit rows it claims to have written through
// its mapping, nor take a sample by reference; it gets FailedPrecondition.
func TestService_RefusesReferencesBelowCoherent(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 16})
	rc, err := rpc.Dial(ctxT(t), n.addr) // no root: Sharing None
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	schema := transitions(t, 1).RowSchema()
	r, err := rpc.Call[reserveResponse](ctxT(t), rc, MethodReserve, reserveRequest{Name: "buf", Schema: schema, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = rpc.Call[sampleResponse](ctxT(t), rc, MethodSample, sampleRequest{Name: "buf", N: 1})
	if !errors.Is(err, rpc.ErrFailedPrecondition) {
		t.Fatalf("sample by reference from a peer without the root: %v, want FailedPrecondition", err)
	}
	_, err = rpc.Call[commitResponse](ctxT(t), rc, MethodCommit, commitRequest{Name: "buf", RID: r.RID, Slots: r.Slots})
	if !errors.Is(err, rpc.ErrFailedPrecondition) {
		t.Fatalf("commit without rows from a peer without the root: %v, want FailedPrecondition", err)
	}
	if st, err := n.b.Stats(); err != nil || st.Inserted != 0 {
		t.Fatalf("the node counts %d inserted (%v)", st.Inserted, err)
	}
}
