package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tensorwire/tensorwire/internal/metrics"
	"github.com/tensorwire/tensorwire/serve"
)

// metricsPrefix starts the line "tensorwire node --metrics" prints on
// stdout after its listening line: the URL of its metrics.
const metricsPrefix = "metrics on "

// serveMetrics listens on addr and serves a new metrics.Node's figures at
// /metrics, in Prometheus's text format, until stop is called. url is the
// address of /metrics (the real port, for port 0).
func serveMetrics(addr string, log *slog.Logger) (mx *metrics.Node, url string, stop func(), err error) {
	reg := prometheus.NewRegistry()
	if mx, err = metrics.New(reg); err != nil {
		return nil, "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", nil, fmt.Errorf("--metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(reg))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	url = "http://" + ln.Addr().String() + "/metrics"
	log.Info("serving metrics", "url", url)
	var once sync.Once
	return mx, url, func() {
		once.Do(func() {
			// Scrapes in progress finish (they read the objects' Stats),
			// for at most 5 s.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if hs.Shutdown(ctx) != nil {
				hs.Close()
			}
			<-done
		})
	}, nil
}

// stats returns the figures of the model served as name, the i-th: the
// Service's (with its clients) once the node serves it, the Manager's
// before.
func (sm *servedModels) stats(name string, i int) func() (serve.Stats, error) {
	return func() (serve.Stats, error) {
		if sm.svc != nil {
			return sm.svc.Stats(name)
		}
		return sm.managers[i].Stats(), nil
	}
}
