//go:build unix

package tensordict

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSyncPrefix_FollowsNoLink: a link or a FIFO planted in a prefix is
// not opened (a FIFO would block the open for good), and a missing prefix
// is an error naming it.
func TestSyncPrefix_FollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "p")
	must[*TensorDict](t)(sample(t, 2).MemmapLike(prefix, Unsynced())).Close()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	if err := os.Symlink(fifo, filepath.Join(prefix, "link.memmap")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(prefix, "next", "pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- SyncPrefix(prefix) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("SyncPrefix opened a FIFO (through a link, or planted): still blocked after 30 s")
	}
	if err := SyncPrefix(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing prefix: %v, want fs.ErrNotExist", err)
	}
}
