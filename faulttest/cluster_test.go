package faulttest

import (
	"fmt"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/internal/testkit/netns"
)

// nodePort is the port every node listens on, each at its own host's address.
const nodePort = 7070

// cluster is a scenario's machines: hosts on a test network, a shared root
// (a folder every host sees, as an NFS mount would be shared), and the
// token file every process reads.
type cluster struct {
	t      *testing.T
	net    *netns.Net
	shared string
	token  string
	rng    *rand.Rand
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	skipShort(t)
	n := netns.New(t) // skips, saying why, where namespaces are unavailable
	dir := t.TempDir()
	c := &cluster{t: t, net: n, shared: filepath.Join(dir, "shared"), token: filepath.Join(dir, "token")}
	if err := os.Mkdir(c.shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nodeproc.WriteRandomToken(c.token); err != nil {
		t.Fatal(err)
	}
	seed := time.Now().UnixNano()
	t.Logf("random seed %d", seed)
	c.rng = rand.New(rand.NewPCG(uint64(seed), 0))
	return c
}

// host adds a host.
func (c *cluster) host(name string) *netns.Host {
	c.t.Helper()
	h, err := c.net.Host(name)
	if err != nil {
		c.t.Fatal(err)
	}
	return h
}

// addr is where a node on h listens.
func addr(h *netns.Host) string {
	return netip.AddrPortFrom(h.Addr(), nodePort).String()
}

// node starts "tensorwire node" on h with the shared root (or root, when
// not empty) and extra flags, and waits until it listens.
func (c *cluster) node(h *netns.Host, root string, extra ...string) *proctest.Proc {
	c.t.Helper()
	if root == "" {
		root = c.shared
	}
	args := append([]string{"node", "--listen", addr(h), "--root", root, "--token-file", c.token}, extra...)
	p := proctest.StartCmd(c.t, "node on "+h.String(), h.Command(program(c.t, "./cmd/tensorwire"), args...))
	p.Expect(c.t, nodeproc.ListeningPrefix)
	return p
}

// helper starts this test binary on h as role with args.
func (c *cluster) helper(h *netns.Host, role, name string, args ...string) *proctest.Proc {
	c.t.Helper()
	cmd := h.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	return proctest.StartCmd(c.t, name+" on "+h.String(), cmd)
}

// bufferArgs are the node flags that serve the buffer "rb".
func bufferArgs(capacity int, lease time.Duration) []string {
	return []string{"--buffer", fmt.Sprintf("rb,capacity=%d,lease=%v", capacity, lease), "--checkpoint-every", "0"}
}

// stat returns the latest stat line of p, parsed.
func stat(p *proctest.Proc) map[string]string { return parseStat(p.Last("stat ")) }

// waitStat waits up to d for p's stats to satisfy ok.
func waitStat(t *testing.T, p *proctest.Proc, d time.Duration, what string, ok func(map[string]string) bool) map[string]string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		s := stat(p)
		if ok(s) {
			return s
		}
		if !p.Alive() {
			t.Fatalf("%s exited while waiting for %s; last stat %v", p.Name(), what, s)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %v; last stat %v", p.Name(), what, d, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// figures logs a scenario's figures on one line, for docs/reliability.md.
func figures(t *testing.T, kv ...any) {
	t.Helper()
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	t.Logf("FIGURES %s%s", t.Name(), b.String())
}

func itoa(n int) string { return strconv.Itoa(n) }
