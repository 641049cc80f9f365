package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// How many refused handshakes a server logs one by one per interval; the
// rest of an interval's are counted and logged as one line at its end, so
// a flood of bad peers costs a few lines every refusalInterval, not one a
// connection.
const (
	refusalBurst    = 5
	refusalInterval = 10 * time.Second
)

// refusalLog rate-limits the log lines of refused connections (a failed
// TLS handshake, a wrong token, a stalled or garbled handshake). Its zero
// value is ready; it is safe for concurrent use.
type refusalLog struct {
	mu         sync.Mutex
	start      time.Time     // of the current interval
	logged     int           // lines logged one by one in it
	suppressed int           // refusals counted, not logged, in it
	lastPeer   string        // the latest suppressed refusal's peer
	timer      *time.Timer   // logs the summary at the interval's end
	closed     bool          // flushed by the server's Close: log everything
	interval   time.Duration // 0: refusalInterval (tests set it)
}

func (r *refusalLog) every() time.Duration {
	if r.interval > 0 {
		return r.interval
	}
	return refusalInterval
}

// refused logs one refusal by peer at WARN with args, unless refusalBurst
// were logged already in this interval: then it counts it for the
// interval's summary line, which it logs at the interval's end (or at the
// next refusal after it, or at flush).
func (r *refusalLog) refused(log *slog.Logger, peer, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if r.start.IsZero() || now.Sub(r.start) >= r.every() {
		r.summaryLocked(log, now)
		r.start, r.logged = now, 0
	}
	if r.logged < refusalBurst || r.closed {
		r.logged++
		r.mu.Unlock()
		log.Warn(msg, append([]any{"peer", peer}, args...)...)
		return
	}
	r.suppressed++
	r.lastPeer = peer
	if r.timer == nil {
		r.timer = time.AfterFunc(r.start.Add(r.every()).Sub(now), func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.summaryLocked(log, time.Now())
		})
	}
	r.mu.Unlock()
}

// summaryLocked logs how many refusals were not logged one by one since
// the interval started, if any, and stops the summary timer. r.mu is held.
func (r *refusalLog) summaryLocked(log *slog.Logger, now time.Time) {
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if r.suppressed == 0 {
		return
	}
	log.LogAttrs(context.Background(), slog.LevelWarn,
		fmt.Sprintf("rpc: %d more refused handshakes in the last %v", r.suppressed, max(now.Sub(r.start).Round(100*time.Millisecond), 100*time.Millisecond)),
		slog.Int("refused", r.suppressed), slog.String("last_peer", r.lastPeer))
	r.suppressed, r.lastPeer = 0, ""
}

// flush logs the pending summary at once; the server calls it as it closes.
func (r *refusalLog) flush(log *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.summaryLocked(log, time.Now())
	r.closed = true
}
