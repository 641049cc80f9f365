package faulttest

import (
	"encoding/json"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"strings"
	"testing"
	"time"
)

// The seed's scenario across hosts: node A (examples/rpcfill) creates a
// memory-mapped TensorDict under the shared root and asks node B, on
// another host with the same root, to fill rows; then node C, on a third
// host with a root of its own, gets the same calls as bytes, automatically.
// Both times rpcfill checks every byte of the filled rows and a sample of
// the others in its own mapping, and exits non-zero if one is wrong.
func TestSeedFillAcrossHosts(t *testing.T) {
	c := newCluster(t)
	a, b, hc := c.host("a"), c.host("b"), c.host("c")
	c.node(b, "")
	c.node(hc, t.TempDir()) // a root of its own: another filesystem identity
	rpcfill := program(t, "./examples/rpcfill")
	for _, tc := range []struct {
		target string
		shared string
	}{
		{addr(b), "shared filesystem: true"},
		{addr(hc), "shared filesystem: false"},
	} {
		p := proctest.StartCmd(t, "rpcfill on "+a.String(), a.Command(rpcfill,
			"--addr", tc.target, "--root", c.shared, "--token-file", c.token, "--rows", "64"))
		if err := p.WaitFor(2 * time.Minute); err != nil {
			t.Fatalf("rpcfill against %s: %v\n%s\n%s", tc.target, err, p.Output(), p.Stderr())
		}
		out := p.Output()
		if !strings.Contains(out, tc.shared) || strings.Count(out, "checked in node A's mapping") != 2 {
			t.Fatalf("rpcfill against %s printed:\n%s\nwant %q and two checks", tc.target, out, tc.shared)
		}
		t.Logf("against %s: %s", tc.target, tc.shared)
	}
}

// The replay benchmark with each of its processes on its own host: the
// buffer node on one, two writers and the trainer on three others, all by
// reference through the shared root. The trainer checks every row it
// samples.
func TestReplayBenchAcrossFourHosts(t *testing.T) {
	c := newCluster(t)
	hosts := []string{"buffer", "writer0", "writer1", "trainer"}
	bin := program(t, "./cmd/tensorwire")
	bh := c.host(hosts[0])
	buf := proctest.StartCmd(t, "bench buffer", bh.Command(bin, "bench", "replay", "--role", "buffer", "--listen", addr(bh),
		"--root", c.shared, "--token-file", c.token, "--capacity", "3000", "--min-size", "500", "--duration", "3s"))
	buf.Expect(t, "listening on")
	var roles []*proctest.Proc
	for _, name := range hosts[1:] {
		role := strings.TrimRight(name, "01")
		h := c.host(name)
		roles = append(roles, proctest.StartCmd(t, "bench "+name, h.Command(bin, "bench", "replay", "--role", role,
			"--addr", addr(bh), "--root", c.shared, "--token-file", c.token, "--mode", "ref")))
	}
	var inserted, sampled, verified int64
	for _, p := range roles {
		if err := p.WaitFor(3 * time.Minute); err != nil {
			t.Fatalf("%s: %v\n%s", p.Name(), err, p.Stderr())
		}
		var res struct {
			Role         string `json:"role"`
			Mode         string `json:"mode"`
			Transitions  int64  `json:"transitions"`
			RowsVerified int64  `json:"rows_verified"`
			TornRows     int64  `json:"torn_rows"`
		}
		if err := json.Unmarshal([]byte("{"+p.Last(`{`)), &res); err != nil {
			t.Fatalf("%s: no result line: %v\n%s", p.Name(), err, p.Output())
		}
		if res.Mode != "ref" || res.Transitions == 0 {
			t.Errorf("%s: %+v, want transitions by reference", p.Name(), res)
		}
		switch res.Role {
		case "trainer":
			if res.TornRows != 0 || res.RowsVerified < res.Transitions {
				t.Errorf("trainer: %+v, want every row verified and none torn", res)
			}
			sampled, verified = res.Transitions, res.RowsVerified
		case "writer":
			inserted += res.Transitions
		}
	}
	if err := buf.Stop(30 * time.Second); err != nil {
		t.Fatalf("buffer node: %v", err)
	}
	figures(t, "hosts", 4, "inserted_timed", inserted, "sampled_timed", sampled, "rows_verified", verified, "torn", 0)
}
