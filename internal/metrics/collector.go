package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector reads the server's and the served objects' Stats at scrape
// time: a Node's prometheus.Collector side.
type collector Node

// A figure read from a Stats: its description and its value.
type figure struct {
	desc *prometheus.Desc
	kind prometheus.ValueType
}

func gauge(name, help string, labels ...string) figure {
	return figure{prometheus.NewDesc(name, help, labels, nil), prometheus.GaugeValue}
}

func counter(name, help string, labels ...string) figure {
	return figure{prometheus.NewDesc(name, help, labels, nil), prometheus.CounterValue}
}

// The node's figures. Counters of the objects are theirs, kept since they
// were opened (a replay buffer's since it was created: it keeps them).
var (
	rpcHandshakes = gauge("tensorwire_rpc_handshakes", "Connections in their handshake.")
	rpcPeers      = gauge("tensorwire_rpc_peers", "Connected peers (clients and other nodes) through the handshake.")
	rpcStreams    = gauge("tensorwire_rpc_streams", "yamux streams being served, idle pooled ones included.")
	rpcSideConns  = gauge("tensorwire_rpc_side_connections", "Side connections attached to the peers' sessions (bulk bodies).")
	rpcMappings   = gauge("tensorwire_rpc_mappings", "Files and TensorDicts the node holds mapped for references.")

	replaySize      = gauge("tensorwire_replay_size", "Transitions a replay buffer holds that can be sampled.", "name")
	replayCapacity  = gauge("tensorwire_replay_capacity", "A replay buffer's capacity, in transitions.", "name")
	replayPending   = gauge("tensorwire_replay_pending", "Slots held by writers' uncommitted reservations.", "name")
	replayLost      = gauge("tensorwire_replay_storage_lost", "1 when the buffer's files were found deleted, replaced or truncated: it refuses its calls.", "name")
	replayInserted  = counter("tensorwire_replay_inserted_total", "Transitions committed.", "name")
	replaySampled   = counter("tensorwire_replay_sampled_total", "Transitions sampled.", "name")
	replayExpired   = counter("tensorwire_replay_expired_total", "Writers' reservations that expired.", "name")
	replayResampled = counter("tensorwire_replay_resampled_total", "Rows found overwritten while sampled, and sampled again.", "name")

	storeRevision = gauge("tensorwire_store_revision", "A store's last revision.", "name")
	storeBins     = gauge("tensorwire_store_bins", "Bins holding items.", "name")
	storeItems    = gauge("tensorwire_store_items", "Items in all bins.", "name")
	storeInline   = gauge("tensorwire_store_inline_bytes", "Bytes of inline values held in memory.", "name")
	storeParams   = gauge("tensorwire_store_params", "Parameter sets.", "name")
	storeVersions = gauge("tensorwire_store_versions", "Parameter versions on disk.", "name")
	storeLeases   = gauge("tensorwire_store_leases", "Readers' leases on parameter versions.", "name")
	storeGets     = gauge("tensorwire_store_pending_gets", "Remote Gets waiting for their acknowledgement.", "name")
	storeLogBytes = gauge("tensorwire_store_log_bytes", "The store's log file's length.", "name")

	serveQueued    = gauge("tensorwire_serve_queued_rows", "Rows waiting for a replica.", "name")
	serveClients   = gauge("tensorwire_serve_clients", "Remote clients registered.", "name")
	serveVersion   = gauge("tensorwire_serve_version", "The latest parameter version loaded.", "name")
	serveRequests  = counter("tensorwire_serve_requests_total", "Prediction requests queued, by reference (the bell) and by rpc.", "name")
	serveQueueFull = counter("tensorwire_serve_queue_full_total", "Requests refused with ErrQueueFull.", "name")
	serveBatches   = counter("tensorwire_serve_batches_total", "Batches run (Forward calls).", "name")
	serveRows      = counter("tensorwire_serve_rows_total", "Rows in the batches run.", "name")
	serveFailed    = counter("tensorwire_serve_failed_batches_total", "Batches whose Forward failed.", "name")
	serveForward   = counter("tensorwire_serve_forward_seconds_total", "Time in Forward, all replicas.", "name")

	loaderConsumers = gauge("tensorwire_loader_consumers", "Live consumers.", "name")
	loaderEpoch     = gauge("tensorwire_loader_epoch", "The current or last epoch; -1 before the first.", "name")
	loaderRunning   = gauge("tensorwire_loader_running", "1 while an epoch is being produced.", "name")
	loaderJoined    = counter("tensorwire_loader_joined_total", "Consumers that joined.", "name")
	loaderDropped   = counter("tensorwire_loader_dropped_total", "Consumers dropped: silent too long or their stream broken (reason=silent), or holding a slot past MaxWait (reason=slow).", "name", "reason")
	loaderLeft      = counter("tensorwire_loader_left_total", "Consumers that left.", "name")
	loaderPublished = counter("tensorwire_loader_published_total", "Batches published.", "name")
	loaderEpochs    = counter("tensorwire_loader_epochs_total", "Epochs completed.", "name")
	loaderWait      = counter("tensorwire_loader_slot_wait_seconds_total", "Time the producer waited for consumers to release slots.", "name")

	figures = []figure{rpcHandshakes, rpcPeers, rpcStreams, rpcSideConns, rpcMappings,
		replaySize, replayCapacity, replayPending, replayLost, replayInserted, replaySampled, replayExpired, replayResampled,
		storeRevision, storeBins, storeItems, storeInline, storeParams, storeVersions, storeLeases, storeGets, storeLogBytes,
		serveQueued, serveClients, serveVersion, serveRequests, serveQueueFull, serveBatches, serveRows, serveFailed, serveForward,
		loaderConsumers, loaderEpoch, loaderRunning, loaderJoined, loaderDropped, loaderLeft, loaderPublished, loaderEpochs, loaderWait}
)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range figures {
		ch <- f.desc
	}
}

// Collect implements prometheus.Collector: each object's Stats, read once.
// An object that fails its Stats (closed as the node stops) is left out.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	emit := func(f figure, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(f.desc, f.kind, v, labels...)
	}
	c.mu.RLock()
	srv, buffers, stores, models, loaders := c.srv, c.buffers, c.stores, c.models, c.loaders
	c.mu.RUnlock()
	if srv != nil {
		st := srv.Stats()
		emit(rpcHandshakes, float64(st.Handshakes))
		emit(rpcPeers, float64(st.Peers))
		emit(rpcStreams, float64(st.Streams))
		emit(rpcSideConns, float64(st.SideConns))
		emit(rpcMappings, float64(st.Mappings))
	}
	for _, b := range buffers {
		st, err := b.v.Stats()
		if err != nil {
			continue
		}
		lost := 0.0
		if st.StorageLost != "" {
			lost = 1
		}
		emit(replaySize, float64(st.Size), b.name)
		emit(replayCapacity, float64(st.Capacity), b.name)
		emit(replayPending, float64(st.Pending), b.name)
		emit(replayLost, lost, b.name)
		emit(replayInserted, float64(st.Inserted), b.name)
		emit(replaySampled, float64(st.Sampled), b.name)
		emit(replayExpired, float64(st.Expired), b.name)
		emit(replayResampled, float64(st.Resampled), b.name)
	}
	for _, s := range stores {
		st := s.v.Stats()
		emit(storeRevision, float64(st.Revision), s.name)
		emit(storeBins, float64(st.Bins), s.name)
		emit(storeItems, float64(st.Items), s.name)
		emit(storeInline, float64(st.InlineBytes), s.name)
		emit(storeParams, float64(st.Params), s.name)
		emit(storeVersions, float64(st.Versions), s.name)
		emit(storeLeases, float64(st.Leases), s.name)
		emit(storeGets, float64(st.Gets), s.name)
		emit(storeLogBytes, float64(st.LogBytes), s.name)
	}
	for _, m := range models {
		st, err := m.v()
		if err != nil {
			continue
		}
		emit(serveQueued, float64(st.Queued), m.name)
		emit(serveClients, float64(st.Clients), m.name)
		emit(serveVersion, float64(st.Version), m.name)
		emit(serveRequests, float64(st.Requests), m.name)
		emit(serveQueueFull, float64(st.QueueFull), m.name)
		emit(serveBatches, float64(st.Batches), m.name)
		emit(serveRows, float64(st.Rows), m.name)
		emit(serveFailed, float64(st.Failed), m.name)
		emit(serveForward, st.Forward.Seconds(), m.name)
	}
	for _, l := range loaders {
		st := l.v.Stats()
		running := 0.0
		if st.Running {
			running = 1
		}
		emit(loaderConsumers, float64(st.Consumers), l.name)
		emit(loaderEpoch, float64(st.Epoch), l.name)
		emit(loaderRunning, running, l.name)
		emit(loaderJoined, float64(st.Joined), l.name)
		emit(loaderDropped, float64(st.Dropped), l.name, "silent")
		emit(loaderDropped, float64(st.DroppedSlow), l.name, "slow")
		emit(loaderLeft, float64(st.Left), l.name)
		emit(loaderPublished, float64(st.Published), l.name)
		emit(loaderEpochs, float64(st.Epochs), l.name)
		emit(loaderWait, float64(st.WaitNS)/1e9, l.name)
	}
}
