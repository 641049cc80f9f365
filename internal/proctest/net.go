package proctest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Listen listens on addr ("host:port"; port 0 for any), retrying for up
// to 10 s: the port of a process just killed may take a moment to be free
// again, and a restarted node wants the same address.
func Listen(addr string) (net.Listener, error) {
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
// the network.
type Proxy struct {
	Addr     string       // where to connect instead of the target
	Up, Down atomic.Int64 // bytes sent to the target, and back
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
	p := &Proxy{Addr: l.Addr().String()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
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
				c, _ := io.Copy(dst, src)
				n.Add(c)
				dst.Close()
				src.Close()
			}
			wg.Go(func() { pipe(out, in, &p.Up) })
			wg.Go(func() { pipe(in, out, &p.Down) })
		}
	})
	return p
}
