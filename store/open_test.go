package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestStore_LockedInThisProcess: a second Open of a folder this process
// has open says so, instead of blaming another process.
func TestStore_LockedInThisProcess(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "already open in this process") ||
		strings.Contains(err.Error(), "another process") {
		t.Fatalf("second Open in one process = %v, want ErrLocked saying already open in this process", err)
	}
	s.Close()
	s2, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after Close = %v", err)
	}
	s2.Close()
}

// TestClient_ClosedIsErrClosed: a closed client's calls fail with the
// package's ErrClosed, as a closed Store's do, not with Unavailable.
func TestClient_ClosedIsErrClosed(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{})
	c := dialT(t, n.addr, "st", root, "ref")
	c.Close()
	if _, err := c.Append(ctx, "b", itemTD(t, 1, 1)); !errors.Is(err, ErrClosed) || errors.Is(err, rpc.ErrUnavailable) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	if _, _, err := c.List(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("List after Close = %v, want ErrClosed", err)
	}
	for _, err := range c.Watch(ctx, "", 0) {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Watch after Close = %v, want ErrClosed", err)
		}
		break
	}
}
