package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The Server's life: NewServer, its root, Serve's accept loop and Close.
// What it serves is in the files named by role: server_conn.go (a
// connection from its handshake to its session's end), server_call.go
// (Register, a stream of calls), server_stream.go (message streams),
// server_side.go (side connections), services.go (the built-in methods).

// Server serves registered handlers to the peers that connect to it. Build
// one with NewServer, register handlers with Register, then call Serve with
// one or more listeners. Every Server also serves the built-in TensorDict
// services (fill, read, describe; see services.go).
//
// A Server is safe for concurrent use. Register handlers before Serve: a
// method registered later is served from then on.
type Server struct {
	o    options
	fsid FSID
	host hostID    // this node's kernel and root mount
	root string    // absolute, symlinks resolved; "" without a root
	res  *resolver // nil without a root

	mu        sync.RWMutex
	handlers  map[string]handler
	streams   map[string]streamHandler // message streams (server_stream.go)
	listeners map[net.Listener]struct{}
	conns     map[*peerConn]struct{}
	sides     map[[32]byte]*sideSet // version 3 sessions' side connections, by their secret
	closed    bool

	handshakes atomic.Int32 // connections in serveConn before their session starts
	refusals   refusalLog   // rate-limits the log lines of refused handshakes

	ctx    context.Context // ends at Close; parent of every call's context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewServer returns a Server configured by opts (WithRoot, WithToken,
// WithTLS, WithLogger, WithLimits, WithWindow, WithKeepAlive,
// WithCompression, WithSideConnections, WithCoherentStorage). With a root,
// the server reads or creates the root's FSID and resolves references
// under it. Limits with a negative field are refused (ErrInvalidArgument).
func NewServer(opts ...Option) (*Server, error) {
	s := &Server{
		o:         newOptions(opts),
		handlers:  map[string]handler{},
		streams:   map[string]streamHandler{},
		listeners: map[net.Listener]struct{}{},
		conns:     map[*peerConn]struct{}{},
		sides:     map[[32]byte]*sideSet{},
	}
	var err error
	if s.o.limits, err = s.o.limits.validate(); err != nil {
		return nil, err
	}
	if s.o.root != "" {
		dir, fsid, err := openRoot(s.o.root)
		if err != nil {
			return nil, err
		}
		s.fsid, s.root = fsid, dir
		sweepProbes(dir)
		if s.res, err = newResolver(dir, 1024); err != nil {
			return nil, err
		}
	}
	s.host = localHostID(s.root)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.res != nil {
		s.wg.Add(1)
		go s.sweep()
	}
	registerServices(s)
	return s, nil
}

// sweep has the resolver drop mappings of deleted files and long-unused
// ones until the server closes.
func (s *Server) sweep() {
	defer s.wg.Done()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.res.sweep(mappingIdle)
		case <-s.ctx.Done():
			return
		}
	}
}

// How often cached mappings are checked, and how long an unused one stays.
const (
	sweepEvery  = 10 * time.Second
	mappingIdle = 5 * time.Minute
)

// peekRoot is openRoot for a client: a root without FSIDFile has the zero
// FSID (no node has made it a root) and is left as it is, since a client
// given any folder must not write into it.
func peekRoot(dir string) (string, FSID, error) {
	abs, _, err := absRoot(dir)
	if err != nil {
		return "", FSID{}, err
	}
	id, err := readFSIDFile(filepath.Join(abs, FSIDFile))
	if errors.Is(err, os.ErrNotExist) {
		return abs, FSID{}, nil
	}
	return abs, id, err
}

// openRoot returns the shared root dir as an absolute path with symlinks
// resolved, and its filesystem identity (created if it has none).
func openRoot(dir string) (string, FSID, error) {
	abs, _, err := absRoot(dir)
	if err != nil {
		return "", FSID{}, err
	}
	id, err := ReadFSID(abs)
	return abs, id, err
}

// absRoot checks that dir is a directory and returns it absolute, its
// symlinks resolved.
func absRoot(dir string) (string, os.FileInfo, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return "", nil, fmt.Errorf("rpc: root: %w", err) // names the whole path
	} else if !fi.IsDir() {
		return "", nil, fmt.Errorf("rpc: root %s is not a directory", dir)
	}
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", nil, fmt.Errorf("rpc: root %q: %w", dir, err)
	}
	return abs, fi, nil
}

// FSID returns the identity of the server's root, or the zero FSID.
func (s *Server) FSID() FSID { return s.fsid }

// Root returns the server's shared root as an absolute path with symlinks
// resolved, or "" without one.
func (s *Server) Root() string { return s.root }

// Rel returns path relative to the server's root, slash-separated, as a
// service names a file to its callers (they join it to their own view of
// the root); false without a root, or if path, its symlinks resolved, does
// not lie inside the root. A path inside the root through a symlink that
// leads out is not inside: a peer sharing the root may not share where the
// symlink leads. The root itself is ".".
func (s *Server) Rel(path string) (string, bool) { return relPath(s.root, path, true) }

// Serve accepts connections on l and serves them until l fails or the
// server is closed; it then returns the listener's error (nil after Close).
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var delay time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// EMFILE and the like: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.o.log.Warn("rpc: accept", "err", err, "retry_in", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		// Counted under the lock that Close sets closed under: a
		// connection accepted as the server closes is closed here, not
		// served by a goroutine that Close's Wait has not counted (an Add
		// after that Wait, which the race detector reported).
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return nil
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(conn)
		}()
	}
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("rpc: server closed")

func (s *Server) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// Close stops the listeners, closes every connection (calls in flight see
// their context end, callers see Unavailable), waits for the handlers to
// return, and unmaps the cached files.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for pc := range s.conns {
		pc.sess.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.refusals.flush(s.o.log)
	if s.res != nil {
		return s.res.close()
	}
	return nil
}
