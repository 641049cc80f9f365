package rpc

import (
	"context"
	"os"
	"runtime"
)

// MethodStats is the built-in method that returns a node's Stats.
const MethodStats = "tensorwire.stats"

// Stats is a snapshot of what a server holds: what monitoring watches, and
// what a test checks has come back to its baseline after hostile peers
// left. Counts are of this moment; the process-wide ones (Goroutines,
// HeapBytes, OpenFiles) include everything else the process runs.
type Stats struct {
	Handshakes int    `codec:"handshakes"` // connections not yet through the handshake
	Peers      int    `codec:"peers"`      // connections through the handshake
	Streams    int    `codec:"streams"`    // streams being served, idle pooled ones included
	Mappings   int    `codec:"mappings"`   // files and TensorDicts the resolver holds mapped
	Goroutines int    `codec:"goroutines"` // runtime.NumGoroutine
	HeapBytes  uint64 `codec:"heap_bytes"` // Go heap in use (runtime.MemStats.HeapInuse)
	OpenFiles  int    `codec:"open_files"` // file descriptors open in the process; -1 if unknown
}

// StatsRequest asks for a node's Stats; it has no fields.
type StatsRequest struct{}

// Stats returns a snapshot of s's load. It reads runtime.MemStats, which
// stops the world briefly: call it for monitoring, not on a hot path.
func (s *Server) Stats() Stats {
	var st Stats
	st.Handshakes = int(s.handshakes.Load())
	s.mu.RLock()
	st.Peers = len(s.conns)
	for pc := range s.conns {
		st.Streams += int(pc.active.Load())
	}
	s.mu.RUnlock()
	if s.res != nil {
		s.res.mu.Lock()
		st.Mappings = len(s.res.cache)
		s.res.mu.Unlock()
	}
	st.Goroutines = runtime.NumGoroutine()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st.HeapBytes = ms.HeapInuse
	st.OpenFiles = -1
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		st.OpenFiles = len(fds) - 1 // less the one ReadDir opened
	}
	return st
}

// Stats returns the node's Stats (MethodStats). The call itself counts: it
// is one of Streams.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return Call[Stats](ctx, c, MethodStats, StatsRequest{})
}
