package rpc

import (
	"context"
	"os"
	"runtime"
	"runtime/metrics"
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
	SideConns  int    `codec:"side_conns"` // side connections attached to the peers' sessions (protocol version 3)
	Mappings   int    `codec:"mappings"`   // files and TensorDicts the resolver holds mapped
	Goroutines int    `codec:"goroutines"` // runtime.NumGoroutine
	HeapBytes  uint64 `codec:"heap_bytes"` // Go heap in use: what runtime.MemStats.HeapInuse counts (heapInUse)
	OpenFiles  int    `codec:"open_files"` // file descriptors open in the process; -1 if unknown
}

// StatsRequest asks for a node's Stats; it has no fields.
type StatsRequest struct{}

// Stats returns a snapshot of s's load. It reads the heap through
// runtime/metrics, which does not stop the world, and lists the process's
// open files: cheap enough to poll, not meant for a hot path.
func (s *Server) Stats() Stats {
	var st Stats
	st.Handshakes = int(s.handshakes.Load())
	s.mu.RLock()
	st.Peers = len(s.conns)
	for pc := range s.conns {
		st.Streams += int(pc.active.Load())
	}
	// By session secret, not by peer: a session's side connections serve
	// calls from the moment the handshake ends, before the peer is counted.
	for _, set := range s.sides {
		st.SideConns += set.len()
	}
	s.mu.RUnlock()
	if s.res != nil {
		s.res.mu.Lock()
		st.Mappings = len(s.res.cache)
		s.res.mu.Unlock()
	}
	st.Goroutines = runtime.NumGoroutine()
	st.HeapBytes = heapInUse()
	st.OpenFiles = -1
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		st.OpenFiles = len(fds) - 1 // less the one ReadDir opened
	}
	return st
}

// heapInUse returns the bytes of the heap's spans in use: its objects, live
// or not yet swept, and the free space in their spans. That is
// runtime.MemStats.HeapInuse, read through runtime/metrics: ReadMemStats
// stops the world, metrics.Read does not.
func heapInUse() uint64 {
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
	}
	metrics.Read(samples)
	var n uint64
	for _, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			n += s.Value.Uint64()
		}
	}
	return n
}

// Stats returns the node's Stats (MethodStats). The call itself counts: it
// is one of Streams.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return Call[Stats](ctx, c, MethodStats, StatsRequest{})
}
