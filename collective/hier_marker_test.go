//go:build linux

package collective

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestHier_HostFolderNotSharedIsRefused: two ranks that claim one host (one
// kernel, one folder path) but do not see one folder there (two
// containers, each with a /dev/shm of its own) do not form the host's
// group: the second rank does not see the leader's marker, and says so,
// which makes every rank fall back (collective.ready). Ranks that do
// share the folder form it. Before, each rank wrote the marker it then
// read, and both went on as one host.
func TestHier_HostFolderNotSharedIsRefused(t *testing.T) {
	shared, other := t.TempDir(), t.TempDir()
	const session = 0x5eed
	rank := func(r int, dir string) *Comm {
		return &Comm{rank: r, size: 2, session: session, cfg: Config{Rank: r, Size: 2, ShmDir: dir}}
	}
	hosts := []int{0, 0}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := rank(0, shared).hierOpen(ctx, hosts)
	if err != nil {
		t.Fatalf("the leader: %v", err)
	}
	defer leader.close()

	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	h, err := rank(1, other).hierOpen(short, hosts)
	if err == nil {
		h.close()
		t.Fatal("rank 1, whose folder is not the leader's, formed the host's group")
	}
	if !strings.Contains(err.Error(), "does not see the marker of its host's leader, rank 0") {
		t.Errorf("rank 1: %v; want it to say it does not see the leader's marker", err)
	}

	h, err = rank(1, shared).hierOpen(ctx, hosts)
	if err != nil {
		t.Fatalf("rank 1, sharing the leader's folder: %v", err)
	}
	h.close()
}
