package replay

import (
	"context"
	"slices"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The methods of the replay service (docs/replay.md describes their
// messages). Every request names the buffer it is for.
const (
	MethodInfo           = "replay.info"
	MethodReserve        = "replay.reserve"
	MethodCommit         = "replay.commit"
	MethodSample         = "replay.sample"
	MethodUpdatePriority = "replay.update_priority"
	MethodCheckpoint     = "replay.checkpoint"
	MethodStats          = "replay.stats"
	MethodDelete         = "replay.delete"
	MethodReset          = "replay.reset"
	MethodSampleSlices   = "replay.sample_slices"
)

// repeatable marks the methods a client sends again when the connection
// broke after their request may have reached the node (service.Methods):
// every one, each for its reason.
var repeatable = service.Methods{
	MethodInfo:  true, // reads
	MethodStats: true,
	// A reservation whose reply was lost holds its slots until its lease
	// runs out, as etcd's LeaseGrant does.
	MethodReserve: true,
	// A commit sent again finds its slots committed under its
	// reservation and succeeds (docs/replay.md, "The buffer node").
	MethodCommit: true,
	// Picks whose reply was lost are picks the caller never saw: a
	// sampler's odds are unchanged, and WithoutReplacement's epoch skips
	// them, as it does the picks of a trainer that stops.
	MethodSample:         true,
	MethodUpdatePriority: true, // sets the same priorities again
	MethodCheckpoint:     true, // writes the same state again
	// A delete sent again skips the rows it deleted (their slots are
	// empty, or written again in another generation when IDs are given);
	// the count in its reply is then of the second try.
	MethodDelete: true,
	// A reset is not: sent again after its reply was lost, it could
	// empty what writers added since. The client gets the error.
	MethodReset: false,
	// As replay.sample: picks whose reply was lost were never seen.
	MethodSampleSlices: true,
}

// Service is the replay service of an rpc.Server: the buffers it serves,
// by name, to clients that Dial them. Buffers under the server's root
// (rpc.WithRoot) are shared by reference with clients on the same
// filesystem, others by bytes only.
//
// A Service is safe for concurrent use; buffers can be added and removed
// while it serves.
type Service struct {
	srv     *rpc.Server // its Stats give NodeHeap
	buffers *service.Registry[*Buffer]
	sent    sentBatches // the batches of samples by bytes, once written, for the next ones

	unpacked bool // answers replay.sample_slices as a node from before packed picks did (tests)
}

// Register adds the replay service's methods to s and returns the Service,
// empty: Add buffers to it. Call it once per server.
func Register(s *rpc.Server) (*Service, error) {
	svc := &Service{srv: s, buffers: service.NewRegistry(s, service.Spec{
		Pkg: "replay", Kind: "buffer", Config: ErrConfig, Exists: ErrExists, NotFound: ErrNotFound,
	}, (*Buffer).Prefix)}
	if err := registerMethods(s, svc); err != nil {
		return nil, err
	}
	return svc, nil
}

// Add serves b under name. b stays the caller's: Remove it (or close the
// server) before closing it. A name already served is ErrExists.
func (svc *Service) Add(name string, b *Buffer) error { return svc.buffers.Add(name, b) }

// Remove stops serving the buffer named name; calls for it fail with
// ErrNotFound from then on.
func (svc *Service) Remove(name string) { svc.buffers.Remove(name) }

// The messages. Field names on the wire are the codec tags.
type (
	infoRequest struct {
		Name string `codec:"name"`
	}
	infoResponse struct {
		ID       string               `codec:"id"`     // changes when the buffer is created anew
		Prefix   string               `codec:"prefix"` // relative to the node's root; "" when not under it
		Capacity int                  `codec:"capacity"`
		Schema   tensordict.RowSchema `codec:"schema"` // per transition; nil until the first batch
		Sampler  string               `codec:"sampler"`
		Writer   writerSpec           `codec:"writer"` // a top-k writer's clients send each transition's key
		LeaseMS  int64                `codec:"lease_ms"`
		// ResampleAll: a sample by reference that finds rows overwritten
		// picks all n again, not those rows (Buffer.resampleAll); omitted
		// when false, so older clients and the golden bytes are unchanged.
		ResampleAll bool `codec:"resample_all,omitempty"`
	}
	reserveRequest struct {
		Name   string               `codec:"name"`
		Schema tensordict.RowSchema `codec:"schema"` // of the batch, per transition
		N      int                  `codec:"n"`
		Keys   []float64            `codec:"keys"` // top-k writers: one per transition
	}
	reserveResponse struct {
		ID    string `codec:"id"`
		RID   uint64 `codec:"rid"`
		Slots []int  `codec:"slots"` // per transition; -1: dropped by the writer policy
	}
	commitRequest struct {
		Name       string    `codec:"name"`
		RID        uint64    `codec:"rid"`
		Slots      []int     `codec:"slots"`
		Priorities []float64 `codec:"priorities"` // nil: the largest so far
		Batch      *rpc.TD   `codec:"batch"`      // the rows, when they were not written into the storage
	}
	commitResponse struct {
		Indices []int `codec:"indices"`
	}
	sampleRequest struct {
		Name  string `codec:"name"`
		N     int    `codec:"n"`
		Bytes bool   `codec:"bytes"` // return the rows, not only their indices
	}
	sampleResponse struct {
		ID    string     `codec:"id"`
		Info  SampleInfo `codec:"info"`
		Batch *rpc.TD    `codec:"batch"`
	}
	updateRequest struct {
		Name       string     `codec:"name"`
		Info       SampleInfo `codec:"info"`
		Priorities []float64  `codec:"priorities"`
	}
	updateResponse struct {
		Updated int `codec:"updated"`
	}
	nameRequest struct {
		Name string `codec:"name"`
	}
)

func registerMethods(s *rpc.Server, svc *Service) error {
	regs := []error{
		rpc.Register(s, MethodInfo, svc.info),
		rpc.Register(s, MethodReserve, svc.reserve),
		rpc.Register(s, MethodCommit, svc.commit),
		rpc.Register(s, MethodSample, svc.sample),
		rpc.Register(s, MethodUpdatePriority, svc.updatePriority),
		rpc.Register(s, MethodCheckpoint, svc.checkpoint),
		rpc.Register(s, MethodStats, svc.stats),
		rpc.Register(s, MethodDelete, svc.delete),
		rpc.Register(s, MethodReset, svc.reset),
		rpc.Register(s, MethodSampleSlices, svc.sampleSlices),
	}
	for _, err := range regs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (svc *Service) info(_ context.Context, req infoRequest) (infoResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return infoResponse{}, err
	}
	b := sb.Item
	return infoResponse{
		ID: b.id, Prefix: sb.Rel, Capacity: b.cfg.Capacity, Schema: b.Schema(),
		Sampler: b.cfg.Sampler.String(), Writer: b.cfg.Writer.normal(), LeaseMS: b.cfg.Lease.Milliseconds(),
		ResampleAll: b.resampleAll(),
	}, nil
}

func (svc *Service) reserve(ctx context.Context, req reserveRequest) (reserveResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return reserveResponse{}, err
	}
	b := sb.Item
	if err := req.Schema.Validate(); err != nil {
		return reserveResponse{}, schemaErrorf("%v", err)
	}
	if req.N <= 0 {
		return reserveResponse{}, schemaErrorf("a reservation of %d transitions", req.N)
	}
	if err := b.enter(); err != nil {
		return reserveResponse{}, err
	}
	defer b.leave()
	r, _, err := b.reserve(ctx, req.Schema, req.N, req.Keys)
	if err != nil {
		return reserveResponse{}, err
	}
	return reserveResponse{ID: b.id, RID: r.rid, Slots: r.slots}, nil
}

func (svc *Service) commit(ctx context.Context, req commitRequest) (commitResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return commitResponse{}, err
	}
	if req.Batch == nil || req.Batch.TensorDict == nil {
		// Rows the client wrote through its own mapping: only a client on
		// the node's page cache can have written them where the node
		// reads.
		if err := rpc.RequireCoherent(ctx, "a commit of rows written"); err != nil {
			return commitResponse{}, err
		}
	}
	b := sb.Item
	if err := checkPriorities(req.Priorities, len(req.Slots)); err != nil {
		return commitResponse{}, err
	}
	if err := b.enter(); err != nil {
		return commitResponse{}, err
	}
	defer b.leave()
	if req.Batch != nil && req.Batch.TensorDict != nil {
		if err := b.writeReserved(req.RID, req.Slots, req.Batch.TensorDict); err != nil {
			return commitResponse{}, err
		}
	}
	idx, err := b.commit(req.RID, req.Slots, req.Priorities)
	return commitResponse{Indices: idx}, err
}

// writeReserved writes a batch that came as bytes into the slots of
// reservation rid, after checking it is that reservation's and matches the
// schema. A reservation that is gone is left to commit to judge.
func (b *Buffer) writeReserved(rid uint64, slots []int, td *tensordict.TensorDict) error {
	n, err := batchLen(td)
	if err != nil {
		return err
	}
	b.mu.Lock()
	r, storage, schema := b.resv[rid], b.storage, b.schema
	b.mu.Unlock()
	if r == nil {
		return nil
	}
	if n != len(r.slots) || !slices.Equal(slots, r.slots) {
		return schemaErrorf("a batch of %d transitions for reservation %d of %d slots", n, rid, len(r.slots))
	}
	if err := schema.Match(td.RowSchema()); err != nil {
		return schemaErrorf("%v", err)
	}
	if err := writeRows(storage, r.slots, td); err != nil {
		// The rows cannot be written: give the slots back now rather than
		// at the end of the lease.
		b.expire(rid)
		return b.noteFault(err)
	}
	return nil
}

func (svc *Service) sample(ctx context.Context, req sampleRequest) (sampleResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return sampleResponse{}, err
	}
	b := sb.Item
	if err := checkSampleSize(req.N); err != nil {
		return sampleResponse{}, err
	}
	if !req.Bytes {
		if err := rpc.RequireCoherent(ctx, "a sample read"); err != nil {
			return sampleResponse{}, err
		}
	}
	if req.Bytes {
		td, back, err := svc.sent.batch(ctx, b, req.N, "transitions")
		if err != nil {
			return sampleResponse{}, err
		}
		info, err := b.SampleInto(ctx, td)
		if err != nil {
			back()
			return sampleResponse{}, err
		}
		return sampleResponse{ID: b.id, Info: info, Batch: &rpc.TD{TensorDict: td, Release: back}}, nil
	}
	if err := b.enter(); err != nil {
		return sampleResponse{}, err
	}
	defer b.leave()
	var info SampleInfo
	if err := b.pick(ctx, req.N, &info); err != nil {
		return sampleResponse{}, err
	}
	return sampleResponse{ID: b.id, Info: info}, nil
}

func (svc *Service) updatePriority(ctx context.Context, req updateRequest) (updateResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return updateResponse{}, err
	}
	n, err := sb.Item.UpdatePriority(ctx, req.Info, req.Priorities)
	return updateResponse{Updated: n}, err
}

func (svc *Service) checkpoint(ctx context.Context, req nameRequest) (rpc.Empty, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return rpc.Empty{}, err
	}
	return rpc.Empty{}, sb.Item.Checkpoint(ctx)
}

func (svc *Service) stats(_ context.Context, req nameRequest) (Stats, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return Stats{}, err
	}
	st, err := sb.Item.Stats()
	if err != nil {
		return Stats{}, err
	}
	st.NodeHeap = svc.srv.Stats().HeapBytes
	return st, nil
}
