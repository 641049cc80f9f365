package metrics

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestNode_ScrapesWhileServing gathers a Node's figures over and over while
// a replay buffer it reports is extended and sampled through rpc: for the
// race detector, and for the figures being there at the end.
func TestNode_ScrapesWhileServing(t *testing.T) {
	root := t.TempDir()
	reg := prometheus.NewRegistry()
	n, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rpc.NewServer(rpc.WithRoot(root), rpc.WithObserver(n))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	b, err := replay.Create(filepath.Join(root, "buf"), replay.Config{Capacity: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	svc, err := replay.Register(srv)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Add("buf", b); err != nil {
		t.Fatal(err)
	}
	n.SetServer(srv)
	n.AddBuffer("buf", b)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, opts := range [][]replay.DialOption{{replay.WithRoot(root)}, {replay.WithBytes()}} {
		wg.Go(func() {
			c, err := replay.Dial(ctx, l.Addr().String(), "buf", opts...)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for range 10 {
				reward, _ := tensordict.FromSlice(make([]float32, 4), 4)
				batch, _ := tensordict.New(4)
				batch.Set("reward", reward)
				if _, err := c.Extend(ctx, batch); err != nil {
					t.Error(err)
					return
				}
				if _, _, err := c.Sample(ctx, 2); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	// Scrape until the clients are done.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, _ := b.Stats()
		if st.Inserted >= 80 || time.Now().After(deadline) {
			break
		}
	}
	close(stop)
	wg.Wait()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				got[f.GetName()] += m.Counter.GetValue()
			case m.Gauge != nil:
				got[f.GetName()] += m.Gauge.GetValue()
			case m.Histogram != nil:
				got[f.GetName()] += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	for name, min := range map[string]float64{
		"tensorwire_rpc_requests_total":           40,
		"tensorwire_rpc_request_duration_seconds": 40,
		"tensorwire_replay_inserted_total":        80,
		"tensorwire_replay_sampled_total":         40,
		"tensorwire_rpc_body_bytes_total":         1,
	} {
		if got[name] < min {
			t.Errorf("%s = %v, want at least %v", name, got[name], min)
		}
	}
}
