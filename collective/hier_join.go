package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// hierState is this rank's part of a hierarchical communicator: its host's
// ranks, which share mappings (a shmGroup of their own, in a folder of the
// host's), and the hosts' leaders, which exchange over TCP.
type hierState struct {
	hosts   []int   // host index per rank (joinResp.Hosts)
	host    int     // this rank's host
	ranks   []int   // its host's ranks, ascending
	local   int     // this rank's index in ranks; 0 is the leader
	leaders []int   // every host's leader, by host index
	byHost  [][]int // every host's ranks, ascending, by host index
	// peers, when every host has as many ranks as this one, is the rank
	// of each host (by host index) at this rank's index in its host: the
	// ranks a large Allreduce's share goes between (hier_ops.go).
	peers []int
	g     *shmGroup
	// k counts the collectives that went through g, guarded by Comm.opMu:
	// collective k uses g's file set k&1 and phases 3k+1 to 3k+3 (the
	// communicator's own numbers count the others too, which g never
	// sees).
	k atomic.Uint64
}

// newHier returns this rank's view of grouping hosts.
func newHier(rank int, hosts []int) *hierState {
	t := topologyOf(hosts)
	h := &hierState{hosts: hosts, host: hosts[rank]}
	h.ranks = t.Hosts[h.host].Ranks
	for i, r := range h.ranks {
		if r == rank {
			h.local = i
		}
	}
	for _, th := range t.Hosts {
		h.leaders = append(h.leaders, th.Leader)
		h.byHost = append(h.byHost, th.Ranks)
	}
	for _, th := range t.Hosts {
		if len(th.Ranks) != len(h.ranks) {
			h.peers = nil
			break
		}
		h.peers = append(h.peers, th.Ranks[h.local])
	}
	return h
}

// hostDir returns the folder the ranks of host h share in session.
func hostDir(shmDir string, session uint64, h int) string {
	return filepath.Join(shmDir, fmt.Sprintf("tensorwire-collective-%016x-h%d", session, h))
}

// makeHostDir returns the folder of this rank's host, with the session's
// marker file. The host's leader makes both (the marker through a rename,
// so that none reads a part-written one); every other rank of the host
// only reads the leader's marker, waiting for it up to hostDirWait (or
// ctx): that proves the ranks that claim one host share the folder (two
// containers of one kernel, with one host name and each a /dev/shm of its
// own, claim one host but do not). Before, every rank wrote the marker it
// then read, which proved nothing.
func makeHostDir(ctx context.Context, c *Comm, h *hierState) (string, error) {
	d := hostDir(c.cfg.shmDir(), c.session, h.host)
	marker := filepath.Join(d, "session")
	want := fmt.Sprintf("%016x\n", c.session)
	if h.local != 0 {
		// A rank without the folder at all cannot share it: say so now,
		// not after waiting for a marker that cannot come.
		if _, err := os.Stat(c.cfg.shmDir()); err != nil {
			return "", err
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(ctx, hostDirWait)
		defer cancel()
		for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
			if b, err := os.ReadFile(marker); err == nil && string(b) == want {
				return d, nil
			}
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("rank %d does not see the marker of its host's leader, rank %d, in %s (waited %v: %v): the ranks that claim one host do not share the folder",
					c.rank, h.ranks[0], d, time.Since(start).Round(time.Millisecond), context.Cause(ctx))
			case <-time.After(pause):
			}
		}
	}
	sweepSessions(c.cfg.shmDir())
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	tmp := filepath.Join(d, fmt.Sprintf("session.%d", c.rank))
	if err := os.WriteFile(tmp, []byte(want), 0o600); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, marker); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return d, nil
}

// hostDirWait is how long a rank waits for its host's leader's marker:
// the ranks come to it together, once rank 0 answered every Join.
const hostDirWait = 10 * time.Second

// hierOpen is this rank's first step into a hierarchy rank 0 proposed:
// its files in its host's folder (none when it is alone on its host). The
// error says why it cannot, for collective.ready.
func (c *Comm) hierOpen(ctx context.Context, hosts []int) (*hierState, error) {
	h := newHier(c.rank, hosts)
	if len(h.ranks) == 1 {
		return h, nil
	}
	d, err := makeHostDir(ctx, c, h)
	if err != nil {
		return nil, fmt.Errorf("the host's shared folder: %w", err)
	}
	if h.g, err = openShmGroup(c, d, h.local, len(h.ranks)); err != nil {
		return nil, err
	}
	h.g.ranks = h.ranks
	return h, nil
}

// hierAttach maps the host's other ranks' control files, once every rank
// said it is ready.
func (h *hierState) attach() error {
	if h.g == nil {
		return nil
	}
	return h.g.attach()
}

// abort marks this rank's phases past the current one as never coming.
func (h *hierState) abort() {
	if h.g != nil {
		h.g.abort()
	}
}

// waitDone waits, up to ctx, until the host's other ranks are done with
// what this rank published (Close).
func (h *hierState) waitDone(ctx context.Context) {
	if h.g != nil {
		h.g.waitAll(ctx, uint32(3*h.k.Load()))
	}
}

func (h *hierState) close() {
	if h != nil && h.g != nil {
		h.g.close()
	}
}

// hierOK reports whether rank 0 proposes a hierarchy: the transport
// allows one, every rank's build can form one, and it gains something
// (hierWorth). Called with j.mu held, once every rank joined.
func (j *joinState) hierOK(tr Transport) bool {
	if tr != Auto && tr != Hier {
		return false
	}
	for _, q := range j.reqs {
		if !q.Hier {
			return false
		}
	}
	return hierWorth(j.resp.Hosts)
}

// hierVerdict is rank 0's answer to collective.ready when it proposed a
// hierarchy: every rank opened its host's files, or why one could not.
// Called with j.mu held, once every rank said.
func (j *joinState) hierVerdict() readyResp {
	for _, q := range j.readies {
		if q.Err != "" {
			return readyResp{Why: fmt.Sprintf("rank %d: %s", q.Rank, q.Err)}
		}
	}
	return readyResp{Hier: true}
}

// noHierWhy says why the ranks formed neither shared mappings nor a
// hierarchy. Called with j.mu held.
func (j *joinState) noHierWhy() string {
	for _, q := range j.reqs {
		if !q.Hier {
			return fmt.Sprintf("rank %d's build cannot form a hierarchy", q.Rank)
		}
	}
	t := topologyOf(j.resp.Hosts)
	if len(t.Hosts) == 1 {
		return "the ranks are all on one host with one shared folder"
	}
	if !hierWorth(j.resp.Hosts) {
		return "the ranks are not all on one host with one shared folder, and no host has two"
	}
	return "the ranks are not all on one host with one shared folder"
}

// hierReady finishes joining a hierarchy rank 0 proposed, as ready says:
// this rank maps its host's other ranks' files, or falls back to TCP with
// every rank (or fails, when Config.Transport is Hier).
func (c *Comm) hierReady(h *hierState, ready readyResp) error {
	if !ready.Hier {
		h.close()
		if c.cfg.Transport == Hier {
			return errorf(ErrJoin, "a hierarchy required, but %s", ready.Why)
		}
		c.log.Warn("collective: a hierarchy unavailable; using TCP", "why", ready.Why)
		return nil
	}
	if err := h.attach(); err != nil {
		h.close()
		return errorf(ErrJoin, "mapping the host's other ranks' segments: %v", err)
	}
	c.hier = h
	return nil
}
