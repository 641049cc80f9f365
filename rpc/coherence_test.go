package rpc

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/internal/testkit/twoview"
)

// otherKernel is the boot id a test client claims (withBootID) to play a
// client on another machine whose filesystem is the node's own folder: one
// page cache, so the coherence probe passes.
var otherKernel = [16]byte{0xee, 0x01}

// levelSeen registers "t.level" on s, which answers with the caller's
// level as the node sees it (PeerSharing).
func levelSeen(t *testing.T, s *Server) {
	t.Helper()
	if err := Register(s, "t.level", func(ctx context.Context, _ struct{}) (Sharing, error) {
		lv, ok := PeerSharing(ctx)
		if !ok {
			return None, errors.New("no sharing in the handler's context")
		}
		return lv, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// levels returns c's level and its node's level of c.
func levels(t *testing.T, c *Client) (client, node Sharing) {
	t.Helper()
	ctx := context.Background()
	client, err := c.Sharing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if node, err = Call[Sharing](ctx, c, "t.level", struct{}{}); err != nil {
		t.Fatal(err)
	}
	return client, node
}

// noProbesLeft fails t when dir (a root's ProbeDir) holds a file.
func noProbesLeft(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("probe file left behind: %s", e.Name())
	}
}

// TestCoherence_Probe plays a client on another kernel over the node's own
// folder: the handshake says Storage (the boot ids differ), and the probe,
// over one page cache, passes. The connection is Coherent on both sides
// only when both opted in, and again after a reconnection.
func TestCoherence_Probe(t *testing.T) {
	root := t.TempDir()
	for _, tc := range []struct {
		name         string
		node, client bool // opted in
		want         Sharing
	}{
		{"both opted in", true, true, Coherent},
		{"only the node", true, false, Storage},
		{"only the client", false, true, Storage},
		{"neither", false, false, Storage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sopts := []Option{WithRoot(root)}
			if tc.node {
				sopts = append(sopts, WithCoherentStorage())
			}
			s, addr := startServer(t, sopts...)
			levelSeen(t, s)
			var logs proctest.LockedBuffer
			copts := []Option{WithRoot(root), withBootID(otherKernel), WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}
			if tc.client {
				copts = append(copts, WithCoherentStorage())
			}
			c := dial(t, addr, copts...)
			cl, node := levels(t, c)
			if cl != tc.want || node != tc.want {
				t.Fatalf("client at %v, the node sees %v; want %v", cl, node, tc.want)
			}
			shared, _ := c.SharedFS(context.Background())
			if shared != (tc.want == Coherent) {
				t.Errorf("SharedFS %v at %v", shared, tc.want)
			}
			noProbesLeft(t, filepath.Join(root, ProbeDir))
			if tc.node && tc.client {
				// A reconnection probes again.
				c.mu.Lock()
				c.cur.sess.Close()
				c.mu.Unlock()
				if cl, node := levels(t, c); cl != Coherent || node != Coherent {
					t.Errorf("after a reconnection: client at %v, the node sees %v; want coherent", cl, node)
				}
				noProbesLeft(t, filepath.Join(root, ProbeDir))
			}
			if tc.client && !tc.node && !strings.Contains(logs.String(), "coherence probe") {
				t.Errorf("the client did not say why it stays at storage:\n%s", logs.String())
			}
		})
	}
}

// TestCoherence_TwoViews probes a real filesystem that keeps no coherent
// mappings across page caches: two bindfs views of one folder, the node's
// root through one, the client's through the other. Both opted in, the
// probe fails, the connection stays at Storage on both sides, and the
// client says why.
func TestCoherence_TwoViews(t *testing.T) {
	src, a, b := twoview.New(t)
	s, addr := startServer(t, WithRoot(a), WithCoherentStorage())
	levelSeen(t, s)
	var logs proctest.LockedBuffer
	start := time.Now()
	c := dial(t, addr, WithRoot(b), WithCoherentStorage(), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	t.Logf("dial with the probe: %v", time.Since(start))
	if cl, node := levels(t, c); cl != Storage || node != Storage {
		t.Fatalf("client at %v, the node sees %v; want storage", cl, node)
	}
	if got := logs.String(); !strings.Contains(got, "coherence probe") || !strings.Contains(got, "did not show") {
		t.Errorf("the client's log does not say the probe failed:\n%s", got)
	}
	t.Log(logs.String())
	noProbesLeft(t, filepath.Join(src, ProbeDir))
}

// TestCoherence_Refused: the node refuses the probe's method when it did
// not opt in, from a peer not at Storage, and malformed or out of order.
func TestCoherence_Refused(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	name := strings.Repeat("ab", 16)
	probe := func(c *Client, req coherenceRequest) error {
		_, err := Call[coherenceResponse](ctx, c, MethodCoherence, req)
		return err
	}
	_, plain := startServer(t, WithRoot(root))
	if err := probe(dial(t, plain, WithRoot(root), withBootID(otherKernel)), coherenceRequest{Step: 1, Name: name}); CodeOf(err) != FailedPrecondition {
		t.Errorf("a node that did not opt in: %v, want FailedPrecondition", err)
	}
	_, addr := startServer(t, WithRoot(root), WithCoherentStorage())
	if err := probe(dial(t, addr, WithRoot(root)), coherenceRequest{Step: 1, Name: name}); CodeOf(err) != FailedPrecondition {
		t.Errorf("a coherent peer: %v, want FailedPrecondition", err)
	}
	if err := probe(dial(t, addr), coherenceRequest{Step: 1, Name: name}); CodeOf(err) != FailedPrecondition {
		t.Errorf("a peer without a root: %v, want FailedPrecondition", err)
	}
	c := dial(t, addr, WithRoot(root), withBootID(otherKernel))
	for _, tc := range []struct {
		what string
		req  coherenceRequest
		want Code
	}{
		{"a name that leads out", coherenceRequest{Step: 1, Name: "../../x"}, InvalidArgument},
		{"upper-case hex", coherenceRequest{Step: 1, Name: strings.ToUpper(name)}, InvalidArgument},
		{"no such probe file", coherenceRequest{Step: 1, Name: name}, FailedPrecondition},
		{"step 2 before step 1", coherenceRequest{Step: 2, Name: name, Seen: true, Word: 1}, FailedPrecondition},
		{"step 3", coherenceRequest{Step: 3, Name: name}, InvalidArgument},
	} {
		if err := probe(c, tc.req); CodeOf(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, err, tc.want)
		}
	}
	// The client's level went through the probe (it did not opt in) and
	// stays at Storage.
	if lv, _ := c.Sharing(ctx); lv != Storage {
		t.Errorf("client at %v, want storage", lv)
	}
}
