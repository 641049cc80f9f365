package collective

import "slices"

// Hierarchical communicators: ranks grouped by host. Rank 0 computes the
// grouping at the rendezvous (groupHosts), from what every rank said of
// itself, and hands it to every rank with the addresses (joinResp.Hosts),
// so every rank holds the same one. docs/collective.md, "Across hosts".

// Topology is how a communicator's ranks are placed, as Join decided it;
// the same value on every rank, fixed for the communicator's life.
type Topology struct {
	// Hosts are the groups of ranks that can share mappings (one kernel,
	// so one page cache, and one Config.ShmDir), in the order of their
	// lowest rank. A communicator whose rank 0 predates the grouping
	// (an older build) shows every rank on a host of its own.
	Hosts []TopologyHost
	// Local is how ranks of one host move tensors between them: SHM or
	// TCP ("" when no host has two ranks).
	Local Transport
	// Between is how hosts move tensors between them: TCP ("" with one
	// host). In a hierarchical communicator (Comm.Transport is Hier) an
	// Allreduce crosses between hosts once per host's share: through
	// the hosts' leaders for small tensors and hosts of different rank
	// counts, else every rank with the ranks at its index on the other
	// hosts; a Bcast once per host, down a tree of the root and the
	// other hosts' leaders; an Allgather as each host's block, between
	// the leaders; a Reduce or ReduceScatter as each host's partial of
	// each piece, from one of the host's ranks to the rank that finishes
	// the piece; a Gather (Scatter) as each other host's block, from its
	// leader to the root (from the root to its leader); an Alltoall as
	// one block each way between every pair of hosts' leaders. Barrier
	// and point-to-point go between the ranks concerned over TCP
	// (docs/collective.md, "Across hosts").
	Between Transport
}

// TopologyHost is one host's ranks.
type TopologyHost struct {
	// Ranks are its ranks, ascending.
	Ranks []int
	// Leader is the rank that speaks for the host between hosts in a
	// hierarchical communicator's small Allreduces (and all of them when
	// hosts have different rank counts), its Allgathers and Alltoalls,
	// and its Bcasts, Gathers and Scatters of a root on another host: its
	// lowest, Ranks[0].
	Leader int
}

// Topology returns how the ranks are grouped by host and which transport
// each level uses. It is the same on every rank. The caller owns the
// returned value.
func (c *Comm) Topology() Topology {
	t := topologyOf(c.hosts)
	switch {
	case c.shm != nil:
		t.Local = SHM
	case c.hier != nil:
		t.Local, t.Between = SHM, TCP
	default:
		t.Between = TCP
		for _, h := range t.Hosts {
			if len(h.Ranks) > 1 {
				t.Local = TCP
			}
		}
	}
	if len(t.Hosts) == 1 {
		t.Between = ""
		if c.shm == nil {
			t.Local = TCP
		}
	}
	return t
}

// topologyOf returns the hosts of a grouping (host index per rank).
func topologyOf(hosts []int) Topology {
	var t Topology
	for r, h := range hosts {
		for len(t.Hosts) <= h {
			t.Hosts = append(t.Hosts, TopologyHost{Leader: -1})
		}
		th := &t.Hosts[h]
		if th.Leader < 0 {
			th.Leader = r
		}
		th.Ranks = append(th.Ranks, r)
	}
	return t
}

// groupHosts numbers the distinct keys (a rank's host identity and shared
// folder) in the order of their first rank: host[r] is rank r's host. Rank
// 0 is on host 0, and a host's lowest rank is its leader.
func groupHosts(keys []string) []int {
	hosts := make([]int, len(keys))
	var seen []string
	for r, k := range keys {
		i := slices.Index(seen, k)
		if i < 0 {
			i = len(seen)
			seen = append(seen, k)
		}
		hosts[r] = i
	}
	return hosts
}

// hierWorth reports whether a grouping gains from a hierarchy: more than
// one host, and a host with more than one rank.
func hierWorth(hosts []int) bool {
	t := topologyOf(hosts)
	if len(t.Hosts) < 2 {
		return false
	}
	for _, h := range t.Hosts {
		if len(h.Ranks) > 1 {
			return true
		}
	}
	return false
}

// hostKey is what groupHosts groups a rank by.
func hostKey(r *joinReq) string { return r.Host + "\x00" + r.Dir }

// soloHosts is the grouping of a rank 0 that sent none: every rank alone.
func soloHosts(n int) []int {
	h := make([]int, n)
	for i := range h {
		h[i] = i
	}
	return h
}
