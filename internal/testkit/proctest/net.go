package proctest

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Listen listens on addr ("host:port"), retrying for up to 10 s: the port
// of a process just killed may take a moment to be free again, and a
// restarted node wants the same address. Port 0 is a free port below the
// kernel's ephemeral range (listenStable), which no other process is given
// for a listener on port 0 or an outgoing connection while this one's
// process is down between a kill and its restart.
func Listen(addr string) (net.Listener, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
		return listenStable(host)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Proxy forwards TCP connections from its own loopback address to a target
// and counts the bytes it carries each way: how a test checks what crossed
// the network. Frozen, it cuts the network as a pulled cable or a
// partition does, without closing anything: it forwards no byte either
// way, and new connections hang before their first byte arrives.
type Proxy struct {
	Addr     string       // where to connect instead of the target
	Up, Down atomic.Int64 // bytes on their way to the target, and back: counted as read, before they are passed on

	mu    sync.Mutex
	thaw  chan struct{} // closed while the proxy forwards
	pipes atomic.Int32  // copying goroutines running, two a connection
}

// WaitIdle waits, up to 30 s, until every connection the proxy accepted
// has ended both ways, so that Up and Down count all it carried; past
// that it fails t.
func (p *Proxy) WaitIdle(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); p.pipes.Load() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("proxy: %d copies still running after 30 s", p.pipes.Load())
		}
	}
}

// Freeze stops the proxy forwarding, until Thaw.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thaw:
		p.thaw = make(chan struct{})
	default: // already frozen
	}
}

// Thaw lets the proxy forward again, the bytes held meanwhile first.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thaw:
	default:
		close(p.thaw)
	}
}

// held blocks while the proxy is frozen.
func (p *Proxy) held() {
	p.mu.Lock()
	thaw := p.thaw
	p.mu.Unlock()
	<-thaw
}

// StartProxy starts a Proxy to target; it stops, closing every connection,
// when the test ends. The counts of a connection are complete once both
// of its ends are closed.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String(), thaw: make(chan struct{})}
	close(p.thaw)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		p.Thaw()
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			pipe := func(dst, src net.Conn, n *atomic.Int64) {
				defer p.pipes.Add(-1)
				defer dst.Close()
				defer src.Close()
				buf := make([]byte, 64<<10)
				for {
					k, err := src.Read(buf)
					p.held()
					if k > 0 {
						// Counted before they are passed on: the peer's
						// answer to them cannot arrive, and a caller who
						// reads the counters after it cannot read them,
						// before they are counted (TestBell_PredictCrossesNoSocket
						// read a call of Dial's as 150 bytes sent after it,
						// on a loaded machine).
						n.Add(int64(k))
						if _, werr := dst.Write(buf[:k]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}
			p.pipes.Add(2)
			wg.Go(func() { pipe(out, in, &p.Up) })
			wg.Go(func() { pipe(in, out, &p.Down) })
		}
	})
	return p
}

// listenStable listens on host at a free port below the kernel's
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): the kernel
// gives none of those to a listener on port 0 or to an outgoing
// connection, so a node killed and restarted on it finds it free, where a
// port from :0 may be another test's node (or a client's end) by then (CI
// saw a restarted node's clients reach another test's node on its old
// port). Only a process that names the port itself can take it, and the
// callers pick at random among thousands. Where the range is unknown or
// leaves no room below it, the port is the kernel's (:0).
func listenStable(host string) (net.Listener, error) {
	lo, hi := stableRange()
	for range 200 {
		if hi <= lo {
			break
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(lo+rand.IntN(hi-lo))))
		if err == nil {
			return l, nil
		}
	}
	return net.Listen("tcp", net.JoinHostPort(host, "0"))
}

// stableRange returns [lo, hi): up to 10,000 ports, from 10,000 up, below
// the first ephemeral port; lo == hi where there is no such room.
func stableRange() (lo, hi int) {
	first := 32768 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				first = v
			}
		}
	}
	return max(10000, first-10000), max(10000, first)
}
