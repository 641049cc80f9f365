package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/serve/mlp"
	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// metricsURL waits for the node to print where its metrics are (after its
// listening line, which Spawn hands on to the node's stderr buffer).
func (n *node) metricsURL(t *testing.T) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for line := range strings.Lines(n.stderr.String()) {
			if url, ok := strings.CutPrefix(strings.TrimSpace(line), metricsPrefix); ok {
				return url
			}
		}
	}
	t.Fatalf("the node printed no %q line; stderr:\n%s", metricsPrefix, n.stderr)
	return ""
}

// scraped is one scrape of a node's metrics, by name and labels.
type scraped []series

func scrapeNode(t *testing.T, url string) scraped {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fams, err := scrape(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return flatten(fams, true)
}

// value returns the value of the series name whose labels include want
// (k=v pairs), summed over the series that match; a histogram's count.
func (s scraped) value(name string, want ...string) float64 {
	var v float64
	for _, x := range s {
		if x.Name != name || !hasLabels(x, want) {
			continue
		}
		switch {
		case x.Value != nil:
			v += *x.Value
		case x.Count != nil:
			v += float64(*x.Count)
		}
	}
	return v
}

func hasLabels(x series, want []string) bool {
	for _, kv := range want {
		k, v, _ := strings.Cut(kv, "=")
		if x.Labels[k] != v { // an empty label is no label, as in Prometheus
			return false
		}
	}
	return true
}

// TestNode_Metrics runs "tensorwire node --metrics" with a replay buffer, a
// store, a model and a loader, has each do some work through its client
// (by reference and by bytes), and checks that the node's /metrics moved
// for each: calls by service, name, method and code, their latency
// histograms, bytes by value and by reference, peers, and each object's
// own figures. Then "tensorwire stats" prints them.
func TestNode_Metrics(t *testing.T) {
	root := t.TempDir()
	sizes := []int{8, 16, 4}
	params, err := mlp.Random(sizes, 5).Memmap(filepath.Join(root, "policy", "params"))
	if err != nil {
		t.Fatal(err)
	}
	params.Close()
	data := filepath.Join(t.TempDir(), "data")
	imageDataset(t, data, 40)
	n := startNode(t, "--root", root, "--metrics", "127.0.0.1:0",
		"--buffer", "buf,capacity=1000", "--store", "st",
		"--serve", "policy,params=policy/params,max-batch=8",
		"--loader", "train,dataset="+data+",batch=8,slots=4")
	url := n.metricsURL(t)
	before := scrapeNode(t, url)
	if got := before.value("tensorwire_replay_capacity", "name=buf"); got != 1000 {
		t.Errorf("replay capacity %v before any call, want 1000", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Replay: extend by reference and by bytes, sample.
	for _, opts := range [][]replay.DialOption{{replay.WithRoot(root)}, {replay.WithBytes()}} {
		c, err := replay.Dial(ctx, n.addr, "buf", opts...)
		if err != nil {
			t.Fatal(err)
		}
		reward, _ := tensordict.FromSlice(make([]float32, 16), 16)
		batch, _ := tensordict.New(16)
		batch.Set("reward", reward)
		if _, err := c.Extend(ctx, batch); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Sample(ctx, 8); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if _, err := replay.Dial(ctx, n.addr, "nope"); !errors.Is(err, rpc.ErrNotFound) {
		t.Fatalf("a buffer the node does not serve: %v", err)
	}

	// Store: append and get.
	sc, err := store.Dial(ctx, n.addr, "st", store.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	x, _ := tensordict.FromSlice(make([]float32, 100))
	td, _ := tensordict.New()
	td.Set("w", x)
	for range 3 {
		if _, err := sc.Append(ctx, "rollouts", td); err != nil {
			t.Fatal(err)
		}
	}
	if items, err := sc.Get(ctx, "rollouts"); err != nil || len(items) != 3 {
		t.Fatalf("Get: %d items, %v", len(items), err)
	}
	sc.Close()

	// Serve: predictions by reference (the bell, around rpc) and by bytes.
	var models []*serve.Client
	for _, opts := range [][]serve.DialOption{{serve.WithRoot(root)}, {serve.WithBytes()}} {
		c, err := serve.Dial(ctx, n.addr, "policy", opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		in, _ := c.InputSchema().Zeros(2)
		if _, _, err := c.Predict(ctx, in); err != nil {
			t.Fatal(err)
		}
		models = append(models, c)
	}

	// Loader: a consumer iterates an epoch, by reference.
	lc, err := loader.Dial(ctx, n.addr, "train", loader.Options{Batch: 8, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	batches := 0
	for _, err := range lc.Batches(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		batches++
	}

	// By reference through the built-in fill: the rows named in the root.
	rc, err := dialNode(t, n.addr, rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	images, err := tensordict.Create(filepath.Join(root, "images"), []int{10},
		tensordict.Field{Key: []string{"memmap"}, DType: memmap.Uint8, Shape: []int{10, 4, 4, 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer images.Close()
	if err := rc.Fill(ctx, images, []int{0, 1, 2}, 1); err != nil {
		t.Fatal(err)
	}

	during := scrapeNode(t, url)
	lc.Close() // its stream ends: observed once the node sees it end
	// A call is observed once its answer is written, which may be after
	// the caller has it (CI once scraped before the fill's was): wait for
	// the last call's and for the stream's.
	var after scraped
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		after = scrapeNode(t, url)
		observed := after.value("tensorwire_rpc_stream_duration_seconds", "service=loader", "name=train", "method=loader.consume") > 0 &&
			after.value("tensorwire_rpc_requests_total", "service=tensorwire", "method="+rpc.MethodFill, "code=OK") > 0
		if observed || time.Now().After(deadline) {
			break
		}
	}

	type check struct {
		what string
		got  float64
		min  float64
	}
	calls := func(service, name, method string) float64 {
		return after.value("tensorwire_rpc_requests_total", "service="+service, "name="+name, "method="+method, "code=OK")
	}
	checks := []check{
		{"replay.reserve calls", calls("replay", "buf", replay.MethodReserve), 2},
		{"replay.commit calls", calls("replay", "buf", replay.MethodCommit), 2},
		{"replay.sample calls", calls("replay", "buf", replay.MethodSample), 2},
		{"replay.sample latency observations", after.value("tensorwire_rpc_request_duration_seconds", "service=replay", "name=buf", "method="+replay.MethodSample), 2},
		{"replay.info for a buffer the node does not serve", after.value("tensorwire_rpc_requests_total", "service=replay", "name=_other", "method="+replay.MethodInfo, "code=NotFound"), 1},
		{"replay bytes by value in", after.value("tensorwire_rpc_body_bytes_total", "service=replay", "name=buf", "method="+replay.MethodCommit, "direction=in", "mode=value"), 16 * 4},
		{"replay bytes by value out", after.value("tensorwire_rpc_body_bytes_total", "service=replay", "name=buf", "method="+replay.MethodSample, "direction=out", "mode=value"), 8 * 4},
		{"replay inserted", after.value("tensorwire_replay_inserted_total", "name=buf"), 32},
		{"replay sampled", after.value("tensorwire_replay_sampled_total", "name=buf"), 16},
		{"replay size", after.value("tensorwire_replay_size", "name=buf"), 32},
		{"store.append calls", calls("store", "st", store.MethodAppend), 3},
		{"store.take calls", calls("store", "st", store.MethodTake), 1},
		{"store revision", after.value("tensorwire_store_revision", "name=st"), 3},
		{"store log bytes", after.value("tensorwire_store_log_bytes", "name=st"), before.value("tensorwire_store_log_bytes", "name=st") + 1},
		{"serve.register calls", calls("serve", "policy", serve.MethodRegister), 1},
		{"serve.predict calls (by bytes)", calls("serve", "policy", serve.MethodPredict), 1},
		{"serve bytes by value in", after.value("tensorwire_rpc_body_bytes_total", "service=serve", "name=policy", "method="+serve.MethodPredict, "direction=in", "mode=value"), 2 * 8 * 4},
		{"serve requests", after.value("tensorwire_serve_requests_total", "name=policy"), 2},
		{"serve batches", after.value("tensorwire_serve_batches_total", "name=policy"), 1},
		{"serve rows", after.value("tensorwire_serve_rows_total", "name=policy"), 4},
		{"serve clients", during.value("tensorwire_serve_clients", "name=policy"), 1},
		{"loader.join calls", calls("loader", "train", loader.MethodJoin), 1},
		{"loader.consume streams", after.value("tensorwire_rpc_stream_duration_seconds", "service=loader", "name=train", "method="+loader.MethodConsume), 1},
		{"loader consumers", during.value("tensorwire_loader_consumers", "name=train"), 1},
		{"loader joined", after.value("tensorwire_loader_joined_total", "name=train"), 1},
		{"loader published", after.value("tensorwire_loader_published_total", "name=train"), 5},
		{"fill calls", calls("tensorwire", "", rpc.MethodFill), 1},
		{"fill bytes by reference", after.value("tensorwire_rpc_body_bytes_total", "service=tensorwire", "method="+rpc.MethodFill, "direction=in", "mode=reference"), 3 * 48},
		{"peers", during.value("tensorwire_rpc_peers"), 3},
		{"go goroutines", after.value("go_goroutines"), 1},
	}
	for _, c := range checks {
		if c.got < c.min {
			t.Errorf("%s: %v, want at least %v", c.what, c.got, c.min)
		}
	}
	if batches != 5 {
		t.Errorf("the consumer got %d batches, want 5", batches)
	}
	if t.Failed() {
		var b strings.Builder
		printSeries(&b, after)
		t.Logf("the node's metrics:\n%s", b.String())
	}

	// tensorwire stats: the same figures, for a person and as JSON.
	code, out, errOut := runCLI(t, "stats", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics"))
	if code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"RPC\n", "REPLAY\n", "STORE\n", "SERVE\n", "LOADER\n",
		"service=replay name=buf method=replay.sample code=OK", "inserted_total", "name=train"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "go_goroutines") {
		t.Errorf("stats without --all shows the Go runtime's figures:\n%s", out)
	}
	code, out, errOut = runCLI(t, "stats", "--json", "--all", url)
	if code != 0 {
		t.Fatalf("stats --json: exit %d: %s", code, errOut)
	}
	var got statsJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, out)
	}
	if v := scraped(got.Metrics).value("tensorwire_replay_inserted_total", "name=buf"); v < 32 {
		t.Errorf("stats --json: inserted %v, want at least 32", v)
	}
	if v := scraped(got.Metrics).value("go_goroutines"); v < 1 {
		t.Errorf("stats --json --all: go_goroutines %v", v)
	}
	for _, c := range models {
		c.Close()
	}
	n.stop(t)
}

// TestStats_Table checks the table "tensorwire stats" prints of a scrape: a
// group per subsystem in a fixed order, integers exact, bytes with their
// unit, seconds as durations, histograms as count, mean and percentile
// bounds; and that a node without metrics is an error.
func TestStats_Table(t *testing.T) {
	text := `# TYPE tensorwire_rpc_peers gauge
tensorwire_rpc_peers 2
# TYPE tensorwire_loader_consumers gauge
tensorwire_loader_consumers{name="train"} 3
# TYPE tensorwire_rpc_body_bytes_total counter
tensorwire_rpc_body_bytes_total{direction="in",method="replay.commit",mode="value",name="buf",service="replay"} 3.145728e+06
# TYPE tensorwire_rpc_request_duration_seconds histogram
tensorwire_rpc_request_duration_seconds_bucket{method="replay.sample",name="buf",service="replay",le="0.001"} 90
tensorwire_rpc_request_duration_seconds_bucket{method="replay.sample",name="buf",service="replay",le="0.01"} 99
tensorwire_rpc_request_duration_seconds_bucket{method="replay.sample",name="buf",service="replay",le="0.1"} 100
tensorwire_rpc_request_duration_seconds_bucket{method="replay.sample",name="buf",service="replay",le="+Inf"} 100
tensorwire_rpc_request_duration_seconds_sum{method="replay.sample",name="buf",service="replay"} 0.05
tensorwire_rpc_request_duration_seconds_count{method="replay.sample",name="buf",service="replay"} 100
# TYPE tensorwire_serve_forward_seconds_total counter
tensorwire_serve_forward_seconds_total{name="policy"} 1.5
# TYPE go_goroutines gauge
go_goroutines 12
`
	url := serveText(t, text)
	code, out, errOut := runCLI(t, "stats", url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := `RPC
  body_bytes_total          service=replay name=buf method=replay.commit direction=in mode=value  3145728 (3.0 MiB)
  peers                                                                                           2
  request_duration_seconds  service=replay name=buf method=replay.sample                          count 100  mean 500µs  p50 <= 1ms  p99 <= 10ms

SERVE
  forward_seconds_total  name=policy  1.5s

LOADER
  consumers  name=train  3
`
	if out != want {
		t.Errorf("stats printed:\n%s\nwant:\n%s", out, want)
	}
	for addr, want := range map[string]string{
		"127.0.0.1:9464":                "http://127.0.0.1:9464/metrics",
		"127.0.0.1:9464/other":          "http://127.0.0.1:9464/other",
		"https://node:9464/metrics?x=1": "https://node:9464/metrics?x=1",
	} {
		if got := metricsAddrURL(addr); got != want {
			t.Errorf("ADDR %s: %s, want %s", addr, got, want)
		}
	}
	if code, _, errOut := runCLI(t, "stats", "127.0.0.1:1"); code != 1 || !strings.Contains(errOut, "tensorwire stats:") {
		t.Errorf("no node: exit %d, stderr %q; want 1", code, errOut)
	}
	if code, _, _ := runCLI(t, "stats"); code != 2 {
		t.Errorf("no ADDR: exit %d, want 2", code)
	}
}

// serveText serves text as a node's /metrics until the test ends and
// returns its URL.
func serveText(t *testing.T, text string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, text)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}
