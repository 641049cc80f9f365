package rpc

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestSide_AbandonedCallLogsNoWarning: a caller that cancels a call on a
// side connection closes the connection, and the handler's response then
// cannot be written. That is the caller's normal way to leave, not the
// node's trouble: the node logs it at Debug. It was a Warn ("rpc: response
// ... use of closed network connection"), which the README's main job
// printed when its trainer left a sample call behind.
func TestSide_AbandonedCallLogsNoWarning(t *testing.T) {
	h := &countingHandler{}
	n := startStreamNode(t, WithLogger(slog.New(h)))
	started, ended := make(chan struct{}, 1), make(chan struct{}, 1)
	must(t, Register(n.s, "test.blocktd", func(ctx context.Context, req sinkReq) (genResp, error) {
		started <- struct{}{}
		<-ctx.Done()
		ended <- struct{}{}
		return genResp{}, ctx.Err()
	}))
	c := dial(t, n.addr)
	ctx, cancel := context.WithCancel(Uncompressed(testCtx(t)))
	done := make(chan error, 1)
	go func() {
		_, err := Call[genResp](ctx, c, "test.blocktd", sinkReq{X: Ref(byteTD(t, 64, 16<<10, 1))})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start")
	}
	cancel()
	<-done
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context did not end within 30 s of the cancel")
	}
	var level slog.Level
	waitFor(t, "the unwritten response logged", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, r := range h.records {
			if strings.HasPrefix(r.Message, "rpc: response") {
				level = r.Level
				return true
			}
		}
		return false
	})
	if level >= slog.LevelWarn {
		t.Errorf("a response its caller abandoned was logged at %v, want below Warn", level)
	}
}
