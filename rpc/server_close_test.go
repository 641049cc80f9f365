package rpc

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// closingListener's Accept blocks until the listener is closed and then
// returns a connection: one accepted just as the server closes.
type closingListener struct {
	accepting chan struct{} // closed when the first Accept has begun
	closed    chan struct{}
	once      sync.Once
	conn      *watchedConn
	calls     atomic.Int32
}

func (l *closingListener) Accept() (net.Conn, error) {
	if l.calls.Add(1) > 1 {
		return nil, net.ErrClosed
	}
	close(l.accepting)
	<-l.closed
	return l.conn, nil
}

func (l *closingListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *closingListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// watchedConn records whether the server began serving it (its first step
// sets the handshake's deadline) and when it is closed.
type watchedConn struct {
	net.Conn
	served atomic.Bool
	once   sync.Once
	done   chan struct{}
}

func (c *watchedConn) SetDeadline(t time.Time) error {
	c.served.Store(true)
	return c.Conn.SetDeadline(t)
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}

// TestServe_AcceptedAsItCloses: a connection that Accept returns while
// Close runs is closed without being served. Before the fix Serve started
// its goroutine after Close's Wait could have returned: the handshake ran
// on a closed server (and the race detector reported the WaitGroup's Add).
func TestServe_AcceptedAsItCloses(t *testing.T) {
	s, err := NewServer(WithRoot(t.TempDir())) // a root: Close waits for its sweeper
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	defer b.Close()
	conn := &watchedConn{Conn: a, done: make(chan struct{})}
	l := &closingListener{accepting: make(chan struct{}), closed: make(chan struct{}), conn: conn}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	<-l.accepting
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve after Close: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	select {
	case <-conn.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the connection accepted as the server closed was left open")
	}
	if conn.served.Load() {
		t.Error("the server began serving a connection accepted after it closed")
	}
}
