// Package metrics exports a node's figures to Prometheus: what its rpc
// Server answers (an rpc.Observer: calls by method, served object and code,
// their latency, their bytes by value and by reference), what it holds
// (peers, streams, side connections, mappings) and what each served object
// holds (a replay buffer's size, a store's items, a model's queue, a
// loader's consumers), read from their Stats at scrape time.
//
// "tensorwire node --metrics ADDR" serves them at /metrics (Handler), and
// "tensorwire stats ADDR" prints them. docs/operations.md lists them.
package metrics

import (
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/store"
)

// Other is the name label of calls for an object the node does not serve
// (a name a peer made up, which would otherwise make a new series).
const Other = "_other"

// Node is a node's metrics: an rpc.Observer (pass it to rpc.WithObserver)
// and a prometheus.Collector of its server's and its objects' figures. Add
// the objects it serves (AddBuffer, AddStore, AddModel, AddLoader) and its
// server (SetServer) once they exist; calls for objects not added are
// counted with the name Other. Safe for concurrent use.
type Node struct {
	requests *prometheus.CounterVec   // service, name, method, code
	duration *prometheus.HistogramVec // service, name, method: calls
	streamed *prometheus.HistogramVec // service, name, method: message streams
	bytes    *prometheus.CounterVec   // service, name, method, direction, mode

	mu      sync.RWMutex
	srv     *rpc.Server
	known   map[string]map[string]bool // service -> names served
	buffers []named[*replay.Buffer]
	stores  []named[*store.Store]
	models  []named[func() (serve.Stats, error)]
	loaders []named[*loader.Producer]
}

type named[T any] struct {
	name string
	v    T
}

// Labels of the rpc figures.
var (
	callLabels  = []string{"service", "name", "method"}
	bytesLabels = []string{"service", "name", "method", "direction", "mode"}
)

// New returns a Node whose figures are registered on reg, with the Go
// runtime's and the process's (client_golang's collectors).
func New(reg prometheus.Registerer) (*Node, error) {
	n := &Node{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorwire_rpc_requests_total",
			Help: "Calls and message streams the node answered, by service, served object (name), method and the code the caller got (OK, NotFound, ...).",
		}, append(callLabels[:3:3], "code")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tensorwire_rpc_request_duration_seconds",
			Help:    "Time from a call's request read to its answer written, by service, served object and method (calls, not message streams).",
			Buckets: prometheus.ExponentialBucketsRange(25e-6, 30, 16),
		}, callLabels),
		streamed: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tensorwire_rpc_stream_duration_seconds",
			Help:    "Lives of the message streams the node served (a loader's consumer, a store's watch), by service, served object and method.",
			Buckets: prometheus.ExponentialBucketsRange(1e-3, 86400, 12),
		}, callLabels),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorwire_rpc_body_bytes_total",
			Help: "Bytes of the TensorDicts in calls: mode=value, bodies as they crossed the wire (in: requests, out: answers); mode=reference, the tensor views requests named in the shared root, which did not cross it.",
		}, bytesLabels),
		known: map[string]map[string]bool{},
	}
	for _, c := range []prometheus.Collector{n.requests, n.duration, n.streamed, n.bytes, (*collector)(n),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Handler returns the handler of /metrics for the figures gathered by g,
// in Prometheus's text format (or what the scraper asks for).
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// SetServer has the collector report srv's Stats (peers, streams, ...).
func (n *Node) SetServer(srv *rpc.Server) {
	n.mu.Lock()
	n.srv = srv
	n.mu.Unlock()
}

// AddBuffer reports the replay buffer b served as name.
func (n *Node) AddBuffer(name string, b *replay.Buffer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.buffers = append(n.buffers, named[*replay.Buffer]{name, b})
	n.knowLocked("replay", name)
}

// AddStore reports the store s served as name.
func (n *Node) AddStore(name string, s *store.Store) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stores = append(n.stores, named[*store.Store]{name, s})
	n.knowLocked("store", name)
}

// AddModel reports the model served as name, whose figures stats returns
// (serve.Service.Stats, or the Manager's before it is served).
func (n *Node) AddModel(name string, stats func() (serve.Stats, error)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.models = append(n.models, named[func() (serve.Stats, error)]{name, stats})
	n.knowLocked("serve", name)
}

// AddLoader reports the loader's producer p served as name.
func (n *Node) AddLoader(name string, p *loader.Producer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.loaders = append(n.loaders, named[*loader.Producer]{name, p})
	n.knowLocked("loader", name)
}

func (n *Node) knowLocked(service, name string) {
	if n.known[service] == nil {
		n.known[service] = map[string]bool{}
	}
	n.known[service][name] = true
}

// Observe counts a call or message stream the server answered
// (rpc.Observer).
func (n *Node) Observe(o rpc.Observation) {
	service, _, _ := strings.Cut(o.Method, ".")
	name := ""
	if o.Method == "" {
		service = ""
	} else if v, ok := nameOf(service, o.Request); ok {
		name = Other
		n.mu.RLock()
		if n.known[service][v] {
			name = v
		}
		n.mu.RUnlock()
	}
	n.requests.WithLabelValues(service, name, o.Method, o.Code.String()).Inc()
	if o.Stream {
		n.streamed.WithLabelValues(service, name, o.Method).Observe(o.Duration.Seconds())
	} else {
		n.duration.WithLabelValues(service, name, o.Method).Observe(o.Duration.Seconds())
	}
	add := func(dir, mode string, b int64) {
		if b > 0 {
			n.bytes.WithLabelValues(service, name, o.Method, dir, mode).Add(float64(b))
		}
	}
	add("in", "value", o.BytesIn)
	add("out", "value", o.BytesOut)
	add("in", "reference", o.RefBytesIn)
}

// nameOf returns the served object a request names: its top-level string
// field tagged with the service's own name (a store's requests name the
// store in "store", and a parameter set in "name"), else the one tagged
// "name" (replay, serve, loader). false when the request has neither, or
// did not decode.
func nameOf(service string, req any) (string, bool) {
	v := reflect.ValueOf(req)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return "", false
	}
	v = v.Elem()
	i := nameField(v.Type(), service)
	if i < 0 {
		return "", false
	}
	return v.Field(i).String(), true
}

type fieldKey struct {
	t       reflect.Type
	service string
}

var nameFields sync.Map // fieldKey -> int: the field's index, -1 for none

// nameField returns the index of t's field that names the served object
// for service (nameOf), or -1; remembered per type.
func nameField(t reflect.Type, service string) int {
	k := fieldKey{t, service}
	if i, ok := nameFields.Load(k); ok {
		return i.(int)
	}
	byTag := map[string]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Type.Kind() != reflect.String {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("codec"), ",")
		if tag == "" {
			tag = f.Name
		}
		byTag[tag] = i
	}
	idx := -1
	if i, ok := byTag[service]; ok && service != "" {
		idx = i
	} else if i, ok := byTag["name"]; ok {
		idx = i
	}
	nameFields.Store(k, idx)
	return idx
}
