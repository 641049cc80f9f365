package rpc

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// countingHandler is a slog.Handler that keeps every record.
type countingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *countingHandler) WithGroup(string) slog.Handler            { return h }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

// refusals returns how many records mention a refused handshake, and how
// many refusals they account for: one each, or a summary's "refused" count.
func (h *countingHandler) refusals() (lines, refused int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if !strings.Contains(r.Message, "refused") {
			continue
		}
		lines++
		n := 1
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "refused" {
				n = int(a.Value.Int64())
			}
			return true
		})
		refused += n
	}
	return lines, refused
}

// TestServer_RefusedHandshakesRateLimited floods a node with 500 clients
// holding the wrong token: its log has a few lines per 10 s, not one per
// refusal, and they account for every refusal.
func TestServer_RefusedHandshakesRateLimited(t *testing.T) {
	h := &countingHandler{}
	s, err := NewServer(WithToken([]byte("s3cret")), WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	const n = 500
	start := time.Now()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := Dial(ctx, l.Addr().String(), WithToken([]byte("guess")))
		cancel()
		if err == nil {
			c.Close()
			t.Fatal("Dial with the wrong token succeeded")
		}
		if !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("Dial: %v, want Unauthenticated", err)
		}
	}
	intervals := int(time.Since(start)/refusalInterval) + 1 // the flood may span several under load
	s.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	lines, refused := h.refusals()
	if max := intervals * (refusalBurst + 1); lines > max {
		t.Errorf("%d log lines for %d refused handshakes over %d interval(s) of %v, want at most %d", lines, n, intervals, refusalInterval, max)
	}
	if refused != n {
		t.Errorf("the log accounts for %d refused handshakes, want %d", refused, n)
	}
}

// TestRefusalLog_SummaryAtIntervalEnd checks that the refusals past the
// burst are summed up in one line once the interval ends, without another
// refusal or a flush to trigger it.
func TestRefusalLog_SummaryAtIntervalEnd(t *testing.T) {
	h := &countingHandler{}
	log := slog.New(h)
	r := &refusalLog{interval: 50 * time.Millisecond}
	for range 20 {
		r.refused(log, "127.0.0.1:1", "rpc: handshake refused", "err", "wrong token")
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, refused := h.refusals(); refused == 20 {
			break
		}
		if time.Now().After(deadline) {
			lines, refused := h.refusals()
			t.Fatalf("30 s on, %d lines account for %d of 20 refusals", lines, refused)
		}
	}
	if lines, _ := h.refusals(); lines != refusalBurst+1 {
		t.Errorf("%d lines, want %d one by one and a summary", lines, refusalBurst+1)
	}
	h.mu.Lock()
	last := h.records[len(h.records)-1]
	h.mu.Unlock()
	if !strings.Contains(last.Message, "15 more refused handshakes in the last") || last.Level != slog.LevelWarn {
		t.Errorf("summary %v %q, want WARN \"15 more refused handshakes in the last ...\"", last.Level, last.Message)
	}
	r.flush(log) // nothing pending: no line
	if lines, _ := h.refusals(); lines != refusalBurst+1 {
		t.Errorf("flush added a line: %d", lines)
	}
}

// TestWithAuthFailure: a server calls its WithAuthFailure hook for each
// peer it refused for its token (wrong, missing, or one it cannot check),
// with the refusal, and not for a peer that authenticated.
func TestWithAuthFailure(t *testing.T) {
	type failure struct {
		remote string
		err    error
	}
	for _, tc := range []struct {
		name           string
		server, client []byte
		want           string // "" : no call
	}{
		{"wrong token", []byte("s3cret"), []byte("guess"), "wrong token"},
		{"no token", []byte("s3cret"), nil, "requires a token"},
		{"a token the server cannot check", nil, []byte("s3cret"), "has no token"},
		{"the right token", []byte("s3cret"), []byte("s3cret"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan failure, 4)
			opts := []Option{WithAuthFailure(func(remote string, err error) { got <- failure{remote, err} })}
			if tc.server != nil {
				opts = append(opts, WithToken(tc.server))
			}
			_, addr := startServer(t, opts...)
			var copts []Option
			if tc.client != nil {
				copts = append(copts, WithToken(tc.client))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Dial(ctx, addr, copts...)
			if err == nil {
				c.Close()
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				select {
				case f := <-got:
					t.Fatalf("hook called for a peer that authenticated: %v", f.err)
				case <-time.After(100 * time.Millisecond):
				}
				return
			}
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("Dial: %v; want Unauthenticated", err)
			}
			select {
			case f := <-got:
				if !errors.Is(f.err, ErrUnauthenticated) || !strings.Contains(f.err.Error(), tc.want) || f.remote == "" {
					t.Errorf("hook got %q, %v; want an Unauthenticated refusal saying %q", f.remote, f.err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the hook was not called")
			}
		})
	}
}
