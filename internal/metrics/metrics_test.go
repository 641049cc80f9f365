package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tensorwire/tensorwire/rpc"
)

type (
	replayLike struct {
		Name string `codec:"name"`
		N    int    `codec:"n"`
	}
	storeLike struct {
		Store string `codec:"store"`
		Name  string `codec:"name"` // a parameter set, not the store
	}
	noName struct {
		Prefix string `codec:"prefix"`
	}
)

func TestNameOf(t *testing.T) {
	for _, tc := range []struct {
		service string
		req     any
		name    string
		ok      bool
	}{
		{"replay", &replayLike{Name: "buf"}, "buf", true},
		{"store", &storeLike{Store: "st", Name: "policy"}, "st", true},
		{"serve", &storeLike{Store: "st", Name: "policy"}, "policy", true},
		{"tensorwire", &noName{Prefix: "x"}, "", false},
		{"replay", nil, "", false},
		{"replay", replayLike{Name: "buf"}, "", false}, // not a pointer: not what rpc hands over
	} {
		name, ok := nameOf(tc.service, tc.req)
		if name != tc.name || ok != tc.ok {
			t.Errorf("nameOf(%q, %#v) = %q, %v; want %q, %v", tc.service, tc.req, name, ok, tc.name, tc.ok)
		}
	}
}

// TestObserve: calls are counted under the names the node serves; a name
// it does not serve is counted as Other (a peer cannot make new series),
// and a method it does not have under no method at all.
func TestObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	n, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.knowLocked("replay", "buf")
	n.mu.Unlock()
	for _, name := range []string{"buf", "buf", "made-up-1", "made-up-2"} {
		n.Observe(rpc.Observation{Method: "replay.sample", Request: &replayLike{Name: name}, Code: rpc.OK,
			Duration: time.Millisecond, BytesOut: 100, RefBytesIn: 10})
	}
	n.Observe(rpc.Observation{Method: "", Code: rpc.Unimplemented})
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"replay", "buf", "replay.sample", "OK"}, 2},
		{[]string{"replay", Other, "replay.sample", "OK"}, 2},
		{[]string{"", "", "", "Unimplemented"}, 1},
	} {
		if got := testutil.ToFloat64(n.requests.WithLabelValues(c.labels...)); got != c.want {
			t.Errorf("requests %v = %v, want %v", c.labels, got, c.want)
		}
	}
	if got := testutil.ToFloat64(n.bytes.WithLabelValues("replay", "buf", "replay.sample", "out", "value")); got != 200 {
		t.Errorf("bytes out by value = %v, want 200", got)
	}
	if got := testutil.ToFloat64(n.bytes.WithLabelValues("replay", "buf", "replay.sample", "in", "reference")); got != 20 {
		t.Errorf("bytes in by reference = %v, want 20", got)
	}
	if got := testutil.CollectAndCount(n.duration); got != 3 {
		t.Errorf("%d latency histograms, want 3 (buf, %s and no method)", got, Other)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkObserve is what a node with --metrics adds to each call: the
// name's lookup and four label lookups (counter, histogram, two bytes).
func BenchmarkObserve(b *testing.B) {
	n, err := New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	n.AddBuffer("buf", nil)
	o := rpc.Observation{Method: "replay.sample", Request: &replayLike{Name: "buf"}, Code: rpc.OK,
		Duration: time.Millisecond, BytesIn: 10, BytesOut: 100}
	for b.Loop() {
		n.Observe(o)
	}
}
