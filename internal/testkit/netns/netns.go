// Package netns gives a test several hosts on one machine: each Host is a
// Linux network namespace with its own IPv4 address on eth0, one end of a
// veth pair whose other end is a port of a bridge in the root namespace.
// Processes in different hosts talk over real TCP between separate
// addresses; the test process, in the root namespace, reaches every host
// through the bridge, whose address is the Net's Gateway. The filesystem,
// process table and everything else but the network (and /sys, which ip
// netns exec remounts) are shared.
//
// It runs the iproute2 commands ip and bridge, and needs root: Available
// says whether it can run, and New skips the test when it cannot.
//
// Every object it makes is named after the process that made it: the
// namespaces tw-PID-K, the bridges twbPIDnK, the bridge-side veth ends
// twPIDhK (K a counter of this process). So concurrent test binaries never
// collide, and New removes what earlier processes left behind when they
// died without cleaning up (a test binary killed by its timeout): objects
// whose PID is no longer alive, or is this process's own though this
// process did not make them (the PID was reused). This assumes every process using the
// package on a machine shares its PID namespace as well as its root
// network namespace.
//
// The hosts reach only their own subnet: one another and the gateway. The
// host-to-host traffic is bridged; on a machine where br_netfilter is
// loaded with net.bridge.bridge-nf-call-iptables=1 and an iptables FORWARD
// chain drops it (as Docker's does), hosts reach the gateway but not one
// another.
package netns

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// runDir is where ip netns keeps the handles of named namespaces.
const runDir = "/var/run/netns"

// upTimeout bounds how long Host waits for a new link to come up, and
// killTimeout how long cleanup waits for SIGKILLed processes to go: both
// poll, and are generous for a machine whose cores are busy.
const (
	upTimeout   = 30 * time.Second
	killTimeout = 30 * time.Second
)

var (
	pid     = os.Getpid()
	netSeq  atomic.Int64 // K of this process's bridges; 0 is Available's probe
	hostSeq atomic.Int64 // K of this process's namespaces and veths; 0 is the probe

	// live holds the names of the objects this process has made and not
	// yet removed (from just before it makes one to just after it removes
	// it): the sweep leaves them alone even though their PID is alive.
	// Anything else bearing this process's PID was left by an earlier
	// process that had the same PID.
	liveMu sync.Mutex
	live   = map[string]bool{}
)

func nsName(k int64) string     { return fmt.Sprintf("tw-%d-%d", pid, k) }
func vethName(k int64) string   { return fmt.Sprintf("tw%dh%d", pid, k) }
func bridgeName(k int64) string { return fmt.Sprintf("twb%dn%d", pid, k) }

func setLive(name string, on bool) {
	liveMu.Lock()
	defer liveMu.Unlock()
	if on {
		live[name] = true
	} else {
		delete(live, name)
	}
}

func isLive(name string) bool {
	liveMu.Lock()
	defer liveMu.Unlock()
	return live[name]
}

// Available returns nil if the package can run here: the process is root,
// ip and bridge (iproute2) are on the PATH, and it can make a namespace, a
// bridge and a veth pair (it makes and removes one of each, once per
// process; later calls return the first answer). Otherwise its error says
// why.
func Available() error { return available() }

var available = sync.OnceValue(func() error {
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Errorf("not running as root (euid %d)", uid)
	}
	for _, cmd := range []string{"ip", "bridge"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Errorf("iproute2's %s: %w", cmd, err)
		}
	}
	sweep() // which New will do anyway, lest a leftover have the probe's names
	ns, veth, br := nsName(0), vethName(0), bridgeName(0)
	for _, name := range []string{ns, veth, br} {
		setLive(name, true)
		defer setLive(name, false)
	}
	err := runAll([][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "add", br, "type", "bridge"},
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
	})
	return errors.Join(err, deleteLink(veth), deleteLink(br), deleteNS(ns))
})

// Net is a test network: a bridge with an address in a /24 of its own, and
// the hosts on it. Its methods are safe for concurrent use.
type Net struct {
	bridge  string
	gateway netip.Addr
	subnet  netip.Prefix

	mu     sync.Mutex // held while a Host is made and during the cleanup
	hosts  []*Host
	closed bool
}

// New makes an empty test network: a bridge in the root namespace, up,
// with spanning tree off (so ports forward as soon as their link is up) and
// the first address of a random /24 of 10.128.0.0/9 (or, failing that, of
// 172.16.0.0/12 or 192.168.0.0/16) that no address or route of the machine
// overlaps (default routes aside).
//
// It skips the test, saying "network namespaces unavailable: " and why,
// when Available fails, and fails the test when it cannot make the
// network. Before making anything it removes what earlier processes that
// died left (see the package documentation), logging what it could not
// remove. It registers a cleanup, run even when the test failed or
// panicked, that SIGKILLs every process in each of its hosts' namespaces
// (including ones those started) and waits until they are gone, deletes
// the veth pairs and namespaces, then the bridge, and fails the test if
// any of that fails.
func New(t testing.TB) *Net {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("network namespaces unavailable: %v", err)
	}
	found, errs := sweep()
	if len(found) > 0 {
		t.Logf("netns: removing what earlier processes left: %s", strings.Join(found, " "))
	}
	for _, err := range errs {
		t.Logf("netns: %v", err)
	}
	n := newNet()
	if len(n.bridge) > unix.IFNAMSIZ-1 {
		t.Fatalf("netns: bridge name %s is longer than %d bytes", n.bridge, unix.IFNAMSIZ-1)
	}
	setLive(n.bridge, true)
	t.Cleanup(func() {
		if err := n.close(); err != nil {
			t.Errorf("netns: cleanup: %v", err)
		}
	})
	if err := n.setUp(); err != nil {
		t.Fatalf("netns: %v", err)
	}
	return n
}

// Make is New for a program that is not a test (a benchmark that puts
// its processes on hosts of their own): it returns an error where New
// skips or fails the test, and the caller must Close the Net, which does
// what New's cleanup does. What a process that dies before Close leaves,
// the next New or Make removes (see the package documentation).
func Make() (*Net, error) {
	if err := Available(); err != nil {
		return nil, fmt.Errorf("netns: network namespaces unavailable: %w", err)
	}
	sweep()
	n := newNet()
	if len(n.bridge) > unix.IFNAMSIZ-1 {
		return nil, fmt.Errorf("netns: bridge name %s is longer than %d bytes", n.bridge, unix.IFNAMSIZ-1)
	}
	setLive(n.bridge, true)
	if err := n.setUp(); err != nil {
		return nil, errors.Join(fmt.Errorf("netns: %w", err), n.close())
	}
	return n, nil
}

// Close kills every process in the Net's hosts and removes the hosts and
// the bridge, as New's cleanup does; Host fails afterwards, and a second
// Close does nothing. It is for a Net from Make; one from New is closed by
// its test's cleanup.
func (n *Net) Close() error { return n.close() }

func newNet() *Net { return &Net{bridge: bridgeName(netSeq.Add(1))} }

// setUp makes the Net's bridge, up, and gives it the first address of a
// free /24.
func (n *Net) setUp() error {
	mac := make([]byte, 6)
	rand.Read(mac)
	mac[0] = mac[0]&^1 | 2 // unicast, locally administered
	// A bridge whose address is not set takes the lowest of its ports',
	// changing it as hosts come and go, under the hosts' ARP caches.
	err := runAll([][]string{
		{"ip", "link", "add", n.bridge, "address", net.HardwareAddr(mac).String(),
			"type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"ip", "link", "set", n.bridge, "up"},
	})
	if err != nil {
		return err
	}
	if n.subnet, err = n.claimSubnet(); err != nil {
		return err
	}
	n.gateway = n.subnet.Addr().Next()
	return nil
}

// Gateway returns the bridge's address: the root namespace's, hence the
// test process's, address on the network, from which the hosts see its
// connections come.
func (n *Net) Gateway() netip.Addr { return n.gateway }

// Subnet returns the network's /24, which holds the gateway's and every
// host's address.
func (n *Net) Subnet() netip.Prefix { return n.subnet }

// Host adds a host, named name in messages, in a namespace of its own,
// with loopback up and an eth0 holding the next free address of the
// subnet (the gateway's is the first, so the first host has the second);
// a Net holds at most 253 hosts. It returns once eth0 is up and its bridge
// port forwards. On error what it made of the host is removed with the
// rest by the Net's cleanup. Once the cleanup has run, Host fails.
func (n *Net) Host(name string) (*Host, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("netns: host %s: the network was already cleaned up", name)
	}
	addr := n.gateway
	for range len(n.hosts) + 1 {
		addr = addr.Next()
	}
	if !n.subnet.Contains(addr.Next()) { // the last address is for broadcast
		return nil, fmt.Errorf("netns: host %s: subnet %s is full", name, n.subnet)
	}
	k := hostSeq.Add(1)
	h := &Host{net: n, name: name, ns: nsName(k), veth: vethName(k), addr: addr}
	if len(h.veth) > unix.IFNAMSIZ-1 {
		return nil, fmt.Errorf("netns: host %s: interface name %s is longer than %d bytes", name, h.veth, unix.IFNAMSIZ-1)
	}
	setLive(h.ns, true)
	setLive(h.veth, true)
	n.hosts = append(n.hosts, h)
	err := runAll([][]string{
		{"ip", "netns", "add", h.ns},
		{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
		{"ip", "link", "set", h.veth, "master", n.bridge, "up"},
		{"ip", "-n", h.ns, "addr", "add", netip.PrefixFrom(addr, n.subnet.Bits()).String(), "dev", "eth0"},
		{"ip", "-n", h.ns, "link", "set", "eth0", "up"},
		{"ip", "-n", h.ns, "link", "set", "lo", "up"},
	})
	if err == nil {
		err = h.waitUp()
	}
	if err != nil {
		return nil, fmt.Errorf("netns: host %s: %w", name, err)
	}
	return h, nil
}

// claimSubnet gives the bridge the first address of a free /24 and returns
// the /24. Another process may claim the same one at the same time: after
// adding its address, the one that sees the other's gives it up and tries
// another.
func (n *Net) claimSubnet() (netip.Prefix, error) {
	pools := []netip.Prefix{
		netip.MustParsePrefix("10.128.0.0/9"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
	}
	for _, pool := range pools {
		for range 64 {
			used, err := usedPrefixes("")
			if err != nil {
				return netip.Prefix{}, err
			}
			p := randomSubnet(pool)
			if overlaps(p, used) {
				continue
			}
			gw := netip.PrefixFrom(p.Addr().Next(), 24).String()
			if _, err := run("ip", "addr", "add", gw, "dev", n.bridge); err != nil {
				return netip.Prefix{}, err
			}
			if used, err = usedPrefixes(n.bridge); err != nil {
				return netip.Prefix{}, err
			}
			if !overlaps(p, used) {
				return p, nil
			}
			if _, err := run("ip", "addr", "del", gw, "dev", n.bridge); err != nil {
				return netip.Prefix{}, err
			}
		}
	}
	return netip.Prefix{}, errors.New("no free /24 in 10.128.0.0/9, 172.16.0.0/12 or 192.168.0.0/16")
}

// randomSubnet returns a random /24 of pool, a prefix of at most 24 bits.
func randomSubnet(pool netip.Prefix) netip.Prefix {
	r, _ := rand.Int(rand.Reader, big.NewInt(1<<(24-pool.Bits())))
	a := pool.Addr().As4()
	v := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8) + uint32(r.Int64())<<8
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0}), 24)
}

func overlaps(p netip.Prefix, used []netip.Prefix) bool {
	for _, u := range used {
		if p.Overlaps(u) {
			return true
		}
	}
	return false
}

// usedPrefixes returns the IPv4 prefixes of the machine's addresses, except
// those of interface skip, and of its routes in every table, except those
// through skip and default routes.
func usedPrefixes(skip string) ([]netip.Prefix, error) {
	var used []netip.Prefix
	add := func(s string) {
		if !strings.Contains(s, "/") {
			s += "/32"
		}
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
			used = append(used, p.Masked())
		}
	}
	out, err := run("ip", "-4", "-o", "addr", "show")
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 2 || strings.TrimSuffix(f[1], ":") == skip {
			continue
		}
		for i := 2; i+1 < len(f); i++ {
			if f[i] == "inet" || f[i] == "peer" {
				add(f[i+1])
			}
		}
	}
	out, err = run("ip", "-4", "-o", "route", "show", "table", "all")
	if err != nil {
		return nil, err
	}
	routeTypes := map[string]bool{"unicast": true, "local": true, "broadcast": true,
		"multicast": true, "unreachable": true, "blackhole": true, "prohibit": true,
		"throw": true, "nat": true, "anycast": true}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) > 0 && routeTypes[f[0]] {
			f = f[1:]
		}
		if len(f) == 0 || f[0] == "default" || skip != "" && devOf(f) == skip {
			continue
		}
		add(f[0])
	}
	return used, nil
}

// devOf returns the interface of a route, given as fields.
func devOf(route []string) string {
	for i := 0; i+1 < len(route); i++ {
		if route[i] == "dev" {
			return route[i+1]
		}
	}
	return ""
}

// close is the Net's cleanup.
func (n *Net) close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	var errs []error
	for _, h := range n.hosts {
		errs = append(errs, killAll(h.ns))
	}
	for _, h := range n.hosts {
		// Deleting a namespace deletes its veth pairs only once the kernel
		// gets round to it; deleting the pair is immediate.
		errs = append(errs, deleteLink(h.veth), deleteNS(h.ns))
	}
	errs = append(errs, deleteLink(n.bridge))
	return errors.Join(errs...)
}

// Host is a host of a Net: a network namespace whose eth0 is a port of the
// Net's bridge. Its methods are safe for concurrent use.
type Host struct {
	net      *Net
	name     string
	ns, veth string
	addr     netip.Addr
	portMu   sync.Mutex // serialises Disconnect and Reconnect
}

// Name returns the name given to Net.Host.
func (h *Host) Name() string { return h.name }

// Namespace returns the name of the host's namespace, as ip netns knows it
// (for ip -n NAME, ip netns exec NAME).
func (h *Host) Namespace() string { return h.ns }

// Addr returns the host's address, on its eth0.
func (h *Host) Addr() netip.Addr { return h.addr }

// String returns the host's name and address, for messages.
func (h *Host) String() string { return fmt.Sprintf("%s(%s)", h.name, h.addr) }

// Command returns a command that runs program name with args inside the
// host's namespace, as ip netns exec NAMESPACE name args... does: ip
// switches namespace and execs name (looked up in the PATH), so once the
// command started its Process.Pid is the program's own and a signal to it
// reaches the program. The program runs in a mount namespace of its own
// where /sys shows the host's network devices; the rest of the filesystem
// is shared. Its environment, standard files, directory and the rest are
// the caller's to set, as for exec.Command. The Net's cleanup kills it if
// it is still running then; waiting for it remains the caller's job.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.ns, name}, args...)...)
}

// Run runs program name with args inside the host's namespace, waits for
// it and returns its combined standard output and error; a program that
// failed yields an error that holds the command line and the output too.
func (h *Host) Run(name string, args ...string) (string, error) {
	return run("ip", append([]string{"netns", "exec", h.ns, name}, args...)...)
}

// Disconnect cuts the host off the network: it disables the host's port of
// the bridge, which then drops every frame from and to the host, so
// nothing gets through between the host and the gateway or the other
// hosts, both ways, until Reconnect. The host's eth0 stays up with its
// carrier on (taking either veth end down would turn the carrier of the
// other end off, which the host would see), so the host cannot tell from
// its own interfaces. Dials to and from the host fail or time out during
// the partition. Established TCP connections survive it unless an end
// gives up meanwhile (an application timeout or keepalive, or TCP's own
// retransmission limit); what was sent during the partition gets through
// at the next retransmission after Reconnect, which backoff may delay by
// up to about as long as the partition lasted. Disconnecting a
// disconnected host does nothing. The bridge re-enables a port whose link
// goes down and up, so taking eth0 down and up inside the host ends the
// partition.
func (h *Host) Disconnect() error { return h.setPort("0", "disabled") }

// Reconnect ends a Disconnect: the host's bridge port forwards again at
// once. Reconnecting a connected host does nothing.
func (h *Host) Reconnect() error { return h.setPort("3", "forwarding") }

func (h *Host) setPort(state, name string) error {
	h.portMu.Lock()
	defer h.portMu.Unlock()
	_, err := run("bridge", "link", "set", "dev", h.veth, "state", state)
	if err == nil {
		var got string
		if got, err = h.portState(); err == nil && got != name {
			err = fmt.Errorf("bridge port %s is %s after setting it %s", h.veth, got, name)
		}
	}
	if err != nil {
		return fmt.Errorf("netns: host %s: %w", h.name, err)
	}
	return nil
}

// portState returns the STP state of the host's bridge port: forwarding,
// disabled...
func (h *Host) portState() (string, error) {
	out, err := run("ip", "-d", "-o", "link", "show", "dev", h.veth)
	if err != nil {
		return "", err
	}
	_, rest, ok := strings.Cut(out, " bridge_slave state ")
	if !ok {
		return "", fmt.Errorf("%s is not a bridge port: %s", h.veth, out)
	}
	state, _, _ := strings.Cut(rest, " ")
	return state, nil
}

// waitUp waits until eth0 and the bridge have their carrier and the
// host's bridge port forwards.
func (h *Host) waitUp() error {
	deadline := time.Now().Add(upTimeout)
	for {
		var why string
		if state, err := h.portState(); err != nil {
			return err
		} else if state != "forwarding" {
			why = "bridge port " + h.veth + " is " + state
		} else if out, err := run("ip", "-n", h.ns, "-o", "link", "show", "dev", "eth0"); err != nil {
			return err
		} else if !strings.Contains(out, ",LOWER_UP") {
			why = "eth0 has no carrier: " + out
		} else if out, err := run("ip", "-o", "link", "show", "dev", h.net.bridge); err != nil {
			return err
		} else if !strings.Contains(out, ",LOWER_UP") {
			why = "the bridge has no carrier: " + out
		} else {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link not up after %v: %s", upTimeout, strings.TrimSpace(why))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
