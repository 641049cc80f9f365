package collective

import (
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"time"
)

// Transport says how ranks move tensors.
type Transport string

// The transports.
const (
	// Auto uses shared mappings when every rank runs on this host and sees
	// the same Config.ShmDir; a hierarchy (Hier) when the ranks are on
	// several hosts and some host has two or more; TCP otherwise.
	Auto Transport = ""
	// SHM requires shared mappings; Join fails if some rank cannot use them.
	SHM Transport = "shm"
	// TCP moves every byte over the ranks' rpc connections, even between
	// processes of one host.
	TCP Transport = "tcp"
	// Hier requires a hierarchical communicator: the ranks of each host
	// share mappings, and the hosts' leaders exchange over TCP (Auto forms
	// one too, wherever some host has two ranks and there is more than one
	// host); Join fails if the ranks cannot form one.
	Hier Transport = "hier"
)

// Config says how to form a communicator. Every rank passes the same Size,
// rendezvous (Addr or Peers), Token and Transport, and its own Rank.
type Config struct {
	// Rank is this process's rank, 0 to Size-1.
	Rank int
	// Size is the number of ranks.
	Size int

	// Addr is rank 0's address ("host:port"): rank 0 listens there, and
	// the others reach it there to find each other (rendezvous). Give it,
	// or Peers.
	Addr string
	// Peers, instead of Addr, is every rank's address: rank r listens on
	// Peers[r], and Peers[0] is the rendezvous.
	Peers []string
	// Listen is where a rank other than 0 listens for its peers when Peers
	// is not given: default port 0 on 127.0.0.1 when Addr is a loopback
	// address, on every interface otherwise (advertised with the address
	// of the interface that reaches rank 0).
	Listen string

	// Transport: Auto (the default), SHM, TCP or Hier.
	Transport Transport
	// ShmDir is the folder, on a memory filesystem, where ranks that share
	// mappings keep them: default /dev/shm (os.TempDir where there is
	// none).
	ShmDir string

	// ShmSendMin is the smallest point-to-point message, in bytes, that
	// goes through the shared folder to a rank that shares it (the
	// shared-mapping transport, or a host-mate in a hierarchy): the sender
	// copies the tensor there and sends a reference, the receiver copies
	// it out. Smaller messages, and every message to a rank that shares
	// no folder, go inline over rpc. 0 means every message, of any size,
	// where the ranks have inboxes (the note that a message is there goes
	// through the folder too, docs/collective.md), else ShmSendMinDefault
	// (4 KiB); a negative value sends every message inline. It is the
	// sender's choice: ranks need not agree on it.
	ShmSendMin int

	// Token, when set, is the shared secret every rank proves it knows
	// before any other rank talks to it (rpc.WithToken).
	Token []byte
	// TLS, when set, runs the ranks' connections inside TLS
	// (rpc.WithTLS): it must carry the certificate each rank serves with
	// and what it needs to verify the others'.
	TLS *tls.Config

	// KeepAlive is how quickly a silent rank (its host down, the network
	// cut) is declared lost: after five times it, default 1 s
	// (rpc.WithKeepAlive). A killed process is seen at once: its sockets
	// close.
	KeepAlive time.Duration

	// Logger receives the communicator's events (ranks lost, fallbacks);
	// default none.
	Logger *slog.Logger
}

// MaxSize is the most ranks a communicator may have. Every rank holds a
// connection and a watch call to every other (2(Size-1) sockets and
// goroutines per rank), rank 0 holds every rank's join call at once, and a
// collective's description, with its per-rank counts (8 bytes a rank),
// must fit the 64 KiB a rank has for it in its shared control file. A
// Config with more ranks is ErrConfig, before anything is allocated.
const MaxSize = 1024

// rendezvous returns rank 0's address.
func (c *Config) rendezvous() string {
	if len(c.Peers) > 0 {
		return c.Peers[0]
	}
	return c.Addr
}

// DefaultConfig returns the configuration every zero field of a Config
// stands for: Config{}.WithDefaults(). Size, Rank and the rendezvous (Addr
// or Peers) have no default: Validate refuses it until they are set.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults returns a copy of c with its zero fields set to their
// defaults where a default is a value: Logger one that discards. The
// others are found when Join needs them: Listen from Addr, ShmDir from
// the filesystem (/dev/shm, or os.TempDir where there is none), and a
// zero KeepAlive leaves rpc's defaults. It checks nothing (Validate).
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports whether c can form a communicator: an error matching
// ErrConfig naming the field and what it wants. It is pure: Join finds
// out whether the addresses answer.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error { return errorf(ErrConfig, format, args...) }
	switch {
	case c.Size < 1:
		return bad("size %d: at least one rank", c.Size)
	case c.Size > MaxSize:
		return bad("size %d: at most %d ranks (MaxSize)", c.Size, MaxSize)
	case c.Rank < 0 || c.Rank >= c.Size:
		return bad("rank %d is not in [0, %d)", c.Rank, c.Size)
	case c.Addr == "" && len(c.Peers) == 0:
		return bad("no rendezvous: give Addr (rank 0's address) or Peers")
	case c.Addr != "" && len(c.Peers) > 0:
		return bad("both Addr and Peers given; give one")
	case len(c.Peers) > 0 && len(c.Peers) != c.Size:
		return bad("%d peers for %d ranks", len(c.Peers), c.Size)
	case c.Transport != Auto && c.Transport != SHM && c.Transport != TCP && c.Transport != Hier:
		return bad("transport %q: want \"\", %q, %q or %q", c.Transport, SHM, TCP, Hier)
	}
	for _, a := range append([]string{c.Addr}, c.Peers...) {
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return bad("address %q: %v", a, err)
		}
	}
	return nil
}

// shmDir returns the folder for shared mappings.
func (c *Config) shmDir() string {
	if c.ShmDir != "" {
		return c.ShmDir
	}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// listenAddr returns where this rank listens.
func (c *Config) listenAddr() (string, error) {
	if len(c.Peers) > 0 {
		return c.Peers[c.Rank], nil
	}
	if c.Rank == 0 {
		return c.Addr, nil
	}
	if c.Listen != "" {
		return c.Listen, nil
	}
	host, _, _ := net.SplitHostPort(c.Addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
		return "127.0.0.1:0", nil
	}
	return ":0", nil
}

// advertise returns the address the others reach l at.
func (c *Config) advertise(l net.Listener) string {
	addr := l.Addr().String()
	if len(c.Peers) > 0 {
		return c.Peers[c.Rank]
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		return addr
	}
	// Listening on every interface: advertise the one that routes to rank
	// 0. A UDP "dial" sends nothing; it only picks the route.
	if conn, err := net.Dial("udp", c.rendezvous()); err == nil {
		defer conn.Close()
		if ua, ok := conn.LocalAddr().(*net.UDPAddr); ok {
			return net.JoinHostPort(ua.IP.String(), port)
		}
	}
	return net.JoinHostPort("127.0.0.1", port)
}
