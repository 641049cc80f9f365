package rpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// watchdog finds a client's node gone silent: crashed without closing its
// connection, its host down, or the network between them cut. TCP alone
// notices none of these until its retransmissions give up, minutes later.
//
// Anything read from the connection is a sign of life. A node silent for
// interval is pinged, and a live one answers at once, even while its
// handlers are busy (yamux answers pings in its receive loop), so silence
// longer than that means the node cannot be reached:
//
//   - after an interval and a half (a ping unanswered for half an
//     interval, when a live node answers in microseconds), calls whose
//     deadline passes fail with Unavailable instead of DeadlineExceeded
//     (unreachable reports it);
//   - after 5 intervals the watchdog closes the connection, so calls without
//     a deadline fail with Unavailable too, and the next call dials again.
//
// If the watchdog itself was not scheduled for a while (this process was
// stopped or starved), it does not count that time as the node's silence,
// and counts the silence before and after it.
type watchdog struct {
	fc       *frameConn
	sess     *yamux.Session
	interval time.Duration

	seen   atomic.Uint64 // fc.reads at the last tick
	silent atomic.Int64  // when the node last said something, as of the last tick (UnixNano)
	gaveUp atomic.Int64  // how long the node had been silent when the watchdog closed the session; 0 if it did not
}

// watch starts a watchdog on a new client connection; it stops when the
// session closes. A non-positive interval means none (unreachable then
// always reports false).
func watch(fc *frameConn, sess *yamux.Session, interval time.Duration, log *slog.Logger, addr string) *watchdog {
	w := &watchdog{fc: fc, sess: sess, interval: interval}
	w.silent.Store(time.Now().UnixNano())
	if interval > 0 {
		go w.run(log, addr)
	}
	return w
}

// Thresholds, in half intervals of silence.
const (
	unreachableAfter = 3
	deadAfter        = 10
)

func (w *watchdog) run(log *slog.Logger, addr string) {
	tick := max(w.interval/4, time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	var pinging atomic.Bool
	for {
		select {
		case <-w.sess.CloseChan():
			return
		case now := <-t.C:
			quiet := w.tick(now, last, tick)
			last = now
			switch {
			case quiet >= deadAfter*w.interval/2:
				log.Warn("rpc: node silent, closing the connection", "addr", addr, "silent", quiet.Round(time.Millisecond))
				w.gaveUp.Store(int64(quiet))
				w.sess.Close()
				return
			case quiet >= w.interval && pinging.CompareAndSwap(false, true):
				go func() {
					w.sess.Ping() // its answer is a read; the error is the session's
					pinging.Store(false)
				}()
			}
		}
	}
}

// tick counts the node's silence at now, the watchdog's previous tick
// having been at last (tick apart when it runs on time), and returns it.
func (w *watchdog) tick(now, last time.Time, tick time.Duration) time.Duration {
	reads := w.fc.reads.Load()
	switch gap := now.Sub(last); {
	case reads != w.seen.Load(): // heard from the node
		w.seen.Store(reads)
		w.silent.Store(now.UnixNano())
	case gap > 3*tick:
		// We were not running to hear it for gap (this process starved or
		// stopped): that time is not the node's silence, but the silence
		// before it still is. (Starting the count again here lost it: on
		// a loaded machine a call across a partition then ended
		// DeadlineExceeded, not Unavailable.)
		w.silent.Add(int64(gap - tick))
	}
	return now.Sub(time.Unix(0, w.silent.Load()))
}

// err returns the error of a call that failed with err on the watched
// connection: Unavailable saying so if the node is or was silent long
// enough (the watchdog closed the connection, or the call's deadline
// passed while it was unreachable), nil otherwise.
func (w *watchdog) err(ctx context.Context, op string, err error) error {
	if quiet := time.Duration(w.gaveUp.Load()); quiet > 0 {
		return &Error{Code: Unavailable, Msg: fmt.Sprintf("%s: node silent for %v, connection given up", op, quiet.Round(time.Millisecond)), err: err}
	}
	if w.unreachable() {
		return unreachableError(ctx, op, err)
	}
	return nil
}

// unreachable reports whether the node has been silent for unreachableAfter
// half intervals, as of now.
func (w *watchdog) unreachable() bool {
	if w.interval <= 0 || w.fc.reads.Load() != w.seen.Load() {
		return false
	}
	return time.Since(time.Unix(0, w.silent.Load())) >= unreachableAfter*w.interval/2
}

// clientKeepAlive returns the watchdog interval for options o.
func (o *options) clientKeepAlive() time.Duration {
	return cmp.Or(o.keepAlive, defaultClientKeepAlive)
}

// unreachableError is the error of a call or dial that failed with err
// while the node could not be reached (a dial not done, a silent
// connection): Unavailable, since retrying later or elsewhere may succeed.
// When ctx's deadline has passed, that is the cause, so that errors.Is(err,
// context.DeadlineExceeded) holds too. A canceled ctx stays Canceled.
func unreachableError(ctx context.Context, op string, err error) error {
	cause := ctx.Err()
	if errors.Is(cause, context.Canceled) {
		return transportError(ctx, op, err)
	}
	if d, ok := ctx.Deadline(); cause == nil && ok && !time.Now().Before(d) {
		cause = context.DeadlineExceeded // the connection's deadline fired first
	}
	if cause == nil {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return transportError(ctx, op, err)
		}
		cause = err // the handshake's own timeout
	}
	return &Error{Code: Unavailable, Msg: op + ": node unreachable: " + err.Error(), err: cause}
}
