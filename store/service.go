package store

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
)

// The methods of the store service (docs/store.md, "The remote store",
// describes their messages). Every request names the store it is for.
const (
	MethodInfo    = "store.info"
	MethodPut     = "store.put"
	MethodAppend  = "store.append"
	MethodExtend  = "store.extend" // several appends as one (Extend)
	MethodTake    = "store.take"   // a Get's first phase, and Peek
	MethodAck     = "store.ack"    // a Get's second phase
	MethodList    = "store.list"
	MethodDelete  = "store.delete"
	MethodPublish = "store.publish"
	MethodRead    = "store.read" // Latest and WaitNewer
	MethodRenew   = "store.renew"
	MethodRelease = "store.release"
	MethodWatch   = "store.watch" // a message stream (rpc.RegisterStream)
	MethodStats   = "store.stats"
)

// repeatable marks the methods a client sends again when the connection
// broke after their request may have reached the node (service.Methods).
// Renew and Release are not: a client sends them once, best effort (a
// lease it fails to renew or release runs out).
var repeatable = service.Methods{
	MethodInfo:  true, // reads
	MethodList:  true,
	MethodRead:  true,
	MethodStats: true,
	// Writes carry a request id the node remembers: sent again, they are
	// answered as the first was, not applied twice.
	MethodPut:     true,
	MethodAppend:  true,
	MethodExtend:  true,
	MethodDelete:  true,
	MethodPublish: true,
	// A Get's take carries the client's id (sent again, the same items);
	// a Peek's is a read; the node remembers the takes it acknowledged.
	MethodTake: true,
	MethodAck:  true,
	// A watch opened again resumes after the last revision it saw.
	MethodWatch: true,
}

// Service is the store service of an rpc.Server: the stores it serves, by
// name, to clients that Dial them. Stores under the server's root
// (rpc.WithRoot) share their large values by reference with clients on the
// same filesystem; others send bytes.
//
// A Service is safe for concurrent use; stores can be added and removed
// while it serves.
type Service struct {
	stores *service.Registry[*Store]
}

// Register adds the store service's methods to srv and returns the
// Service, empty: Add stores to it. Call it once per server.
func Register(srv *rpc.Server) (*Service, error) {
	svc := &Service{stores: service.NewRegistry(srv, service.Spec{
		Pkg: "store", Kind: "store", Exists: ErrExists, NotFound: ErrNotFound, Check: CheckName,
	}, (*Store).Dir)}
	regs := []error{
		rpc.Register(srv, MethodInfo, svc.info),
		rpc.Register(srv, MethodPut, svc.put, rpc.PlaceBytes(svc.placePut)),
		rpc.Register(srv, MethodAppend, svc.append, rpc.PlaceBytes(svc.placePut)),
		rpc.Register(srv, MethodExtend, svc.extend, rpc.PlaceBytes(svc.placeExtend)),
		rpc.Register(srv, MethodTake, svc.take),
		rpc.Register(srv, MethodAck, svc.ack),
		rpc.Register(srv, MethodList, svc.list),
		rpc.Register(srv, MethodDelete, svc.delete),
		rpc.Register(srv, MethodPublish, svc.publish, rpc.PlaceBytes(svc.placePublish)),
		rpc.Register(srv, MethodRead, svc.read),
		rpc.Register(srv, MethodRenew, svc.renew),
		rpc.Register(srv, MethodRelease, svc.release),
		rpc.RegisterStream(srv, MethodWatch, svc.watch),
		rpc.Register(srv, MethodStats, svc.stats),
	}
	for _, err := range regs {
		if err != nil {
			return nil, err
		}
	}
	return svc, nil
}

// Add serves s under name. s stays the caller's: Remove it (or close the
// server) before closing it. A name already served is ErrExists.
func (svc *Service) Add(name string, s *Store) error { return svc.stores.Add(name, s) }

// Remove stops serving the store named name; calls for it fail with
// ErrNotFound from then on.
func (svc *Service) Remove(name string) { svc.stores.Remove(name) }

// The messages. Field names on the wire are the codec tags.
type (
	storeRequest struct {
		Store string `codec:"store"`
	}
	infoResponse struct {
		ID            string `codec:"id"`  // changes when the store is created anew
		Dir           string `codec:"dir"` // the store's folder relative to the node's root; "" when not under it
		InlineBytes   int64  `codec:"inline_bytes"`
		MaxValueBytes int64  `codec:"max_value_bytes"`
		LeaseMS       int64  `codec:"lease_ms"`
		GetTimeoutMS  int64  `codec:"get_timeout_ms"`
		NoSync        bool   `codec:"no_sync"`
	}
	// valueMsg is a value sent to the node: its bytes (TD), or the name of
	// a prefix the client wrote into the store's staging folder (Staged,
	// "staging/" and 32 hex digits). Exactly one is set.
	valueMsg struct {
		TD     *rpc.TD `codec:"td"`
		Staged string  `codec:"staged"`

		placed uint64 // not on the wire: the id placeValue gave TD's bytes
	}
	putRequest struct {
		Store string   `codec:"store"`
		Bin   string   `codec:"bin"`
		Value valueMsg `codec:"value"`
		Req   reqID    `codec:"req"`
	}
	// extendRequest appends Values to Bin, in order, as one operation.
	extendRequest struct {
		Store  string     `codec:"store"`
		Bin    string     `codec:"bin"`
		Values []valueMsg `codec:"values"`
		Req    reqID      `codec:"req"`
	}
	revResponse struct {
		Rev uint64 `codec:"rev"`
	}
	takeRequest struct {
		Store string `codec:"store"`
		Bin   string `codec:"bin"`
		Take  uint64 `codec:"take"` // a Get: the client's id for it (a retry sends the same); 0: a Peek
		Refs  bool   `codec:"refs"` // the client maps prefixes itself: send their paths
	}
	// itemMsg is a value sent to the client: its bytes, or the path of its
	// prefix relative to the store's folder ("values/" and 16 hex digits).
	itemMsg struct {
		TD   *rpc.TD `codec:"td"`
		Path string  `codec:"path"`
	}
	takeResponse struct {
		Take  uint64    `codec:"take"` // 0: nothing to acknowledge
		Rev   uint64    `codec:"rev"`
		Items []itemMsg `codec:"items"`
	}
	ackRequest struct {
		Store string `codec:"store"`
		Take  uint64 `codec:"take"`
		Drop  bool   `codec:"drop"` // give the items back instead of removing them
	}
	listResponse struct {
		Bins map[string]int `codec:"bins"`
		Rev  uint64         `codec:"rev"`
	}
	deleteRequest struct {
		Store string `codec:"store"`
		Bin   string `codec:"bin"`
		Req   reqID  `codec:"req"`
	}
	publishRequest struct {
		Store string   `codec:"store"`
		Name  string   `codec:"name"`
		Value valueMsg `codec:"value"`
		Req   reqID    `codec:"req"`
	}
	publishResponse struct {
		Version uint64 `codec:"version"`
		Rev     uint64 `codec:"rev"`
	}
	readRequest struct {
		Store string `codec:"store"`
		Name  string `codec:"name"`
		After uint64 `codec:"after"` // a version newer than this
		Wait  bool   `codec:"wait"`  // wait for one (WaitNewer); else ErrNotFound
		Refs  bool   `codec:"refs"`
	}
	readResponse struct {
		Version uint64  `codec:"version"`
		Lease   uint64  `codec:"lease"`
		LeaseMS int64   `codec:"lease_ms"`
		Path    string  `codec:"path"`
		TD      *rpc.TD `codec:"td"`
	}
	renewRequest struct {
		Store  string     `codec:"store"`
		Leases []leaseRef `codec:"leases"`
	}
	renewResponse struct {
		Lost []uint64 `codec:"lost"`
	}
	releaseRequest struct {
		Store  string   `codec:"store"`
		Leases []uint64 `codec:"leases"`
	}
	// watchRequest opens a watch stream; the node then sends watchMessages
	// until the caller cancels the stream or an error ends it (the caller
	// sends nothing).
	watchRequest struct {
		Store  string `codec:"store"`
		ID     string `codec:"id"` // the store's id as the client knows it; "": any
		Prefix string `codec:"prefix"`
		After  uint64 `codec:"after"`
	}
	watchMessage struct {
		Events []Event `codec:"events"`
		Seen   uint64  `codec:"seen"` // the revision the node has looked up to: where to resume
	}
)

func (svc *Service) info(_ context.Context, req storeRequest) (infoResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return infoResponse{}, err
	}
	o := st.Item.opts
	return infoResponse{ID: st.Item.ID(), Dir: st.Rel, InlineBytes: o.InlineBytes, MaxValueBytes: o.MaxValueBytes,
		LeaseMS: o.LeaseTTL.Milliseconds(), GetTimeoutMS: o.GetTimeout.Milliseconds(), NoSync: o.NoSync}, nil
}

// ingestMsg makes a value sent by a client one of the store's.
func (s *Store) ingestMsg(v valueMsg, asPrefix bool) (*ingest, error) {
	switch {
	case v.Staged != "" && v.TD != nil && v.TD.TensorDict != nil:
		return nil, errorf(ErrFormat, "a value sent both as bytes and staged")
	case v.Staged != "":
		return s.ingestStaged(v.Staged)
	case v.TD != nil && v.TD.TensorDict != nil && v.placed != 0 && v.TD.TensorDict.Prefix() == s.nodeStaged(v.placed):
		return s.ingestPlaced(v.TD.TensorDict, v.placed)
	case v.TD != nil && v.TD.TensorDict != nil:
		return s.ingestTD(v.TD.TensorDict, asPrefix)
	}
	return nil, errorf(ErrFormat, "no value")
}

// answered returns the result of a request made already, if it was.
func (s *Store) answered(req reqID) (reqEntry, bool, error) {
	s.mu.Lock()
	e, done, err := s.seenLocked(req)
	s.mu.Unlock()
	if done {
		return e, true, s.waitRead(e.Rev)
	}
	return e, false, err
}

func (svc *Service) store(req putRequest, op uint8) (revResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return revResponse{}, err
	}
	if err := CheckName(req.Bin); err != nil {
		return revResponse{}, err
	}
	if e, done, err := st.Item.answered(req.Req); err != nil || done {
		return revResponse{Rev: e.Rev}, err
	}
	in, err := st.Item.ingestMsg(req.Value, false)
	if err != nil {
		return revResponse{}, err
	}
	rev, err := st.Item.putValue(req.Bin, in, op, req.Req)
	return revResponse{Rev: rev}, err
}

// placePut, placePublish and placeExtend place a large value's bytes in
// the node's staging folder as they arrive (placeValue).
func (svc *Service) placePut(req *putRequest, td *rpc.TD, l rpc.Layout) (rpc.Placement, error) {
	return svc.placeValue(req.Store, &req.Value, false, td, l)
}

func (svc *Service) placePublish(req *publishRequest, td *rpc.TD, l rpc.Layout) (rpc.Placement, error) {
	return svc.placeValue(req.Store, &req.Value, true, td, l)
}

// placeExtend places each of an Extend's values that a put of it would.
func (svc *Service) placeExtend(req *extendRequest, td *rpc.TD, l rpc.Layout) (rpc.Placement, error) {
	for i := range req.Values {
		if req.Values[i].TD == td {
			return svc.placeValue(req.Store, &req.Values[i], false, td, l)
		}
	}
	return rpc.Placement{}, nil
}

func (svc *Service) put(_ context.Context, req putRequest) (revResponse, error) {
	return svc.store(req, recPut)
}

func (svc *Service) append(_ context.Context, req putRequest) (revResponse, error) {
	return svc.store(req, recAppend)
}

func (svc *Service) extend(_ context.Context, req extendRequest) (revResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return revResponse{}, err
	}
	if err := checkExtend(req.Bin, len(req.Values)); err != nil {
		return revResponse{}, err
	}
	if e, done, err := st.Item.answered(req.Req); err != nil || done {
		return revResponse{Rev: e.Rev}, err
	}
	ins, err := st.Item.ingestAll(len(req.Values), func(i int) (*ingest, error) { return st.Item.ingestMsg(req.Values[i], false) })
	if err != nil {
		return revResponse{}, err
	}
	rev, err := st.Item.putValues(req.Bin, ins, recAppend, req.Req)
	return revResponse{Rev: rev}, err
}

// Hooks for tests: testBeforeTake runs as the node starts a Get's take,
// testAfterDrop once it has given a take back.
var testBeforeTake, testAfterDrop func(take uint64)

func (svc *Service) take(_ context.Context, req takeRequest) (takeResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return takeResponse{}, err
	}
	if testBeforeTake != nil && req.Take != 0 {
		testBeforeTake(req.Take)
	}
	s := st.Item
	var t taken
	if req.Take != 0 {
		t, err = s.takeAs(req.Bin, req.Take, s.opts.GetTimeout)
	} else {
		t, err = s.takeItems(req.Bin, false, 0)
	}
	if err != nil {
		return takeResponse{}, err
	}
	resp := takeResponse{Take: t.id, Rev: t.rev, Items: make([]itemMsg, 0, len(t.items))}
	for _, it := range t.items {
		var m itemMsg
		switch {
		case it.inline != nil:
			td, err := decodeValue(it.inline) // aliases the value: nothing writes it
			if err != nil {
				return takeResponse{}, err
			}
			m.TD = &rpc.TD{TensorDict: td}
		case req.Refs && st.Rel != "":
			m.Path = valuesDir + "/" + filepath.Base(s.valuePath(it.id))
		default:
			td, err := s.mapping(it.id)
			if err != nil {
				return takeResponse{}, err
			}
			m.TD = &rpc.TD{TensorDict: td}
		}
		resp.Items = append(resp.Items, m)
	}
	return resp, nil
}

// takeAs is takeItems for a Get whose id the client chose: a retried take
// of the same id returns the same items again.
func (s *Store) takeAs(bin string, id uint64, timeout time.Duration) (taken, error) {
	if err := CheckName(bin); err != nil {
		return taken{}, err
	}
	s.mu.Lock()
	if err := s.enterLocked(); err != nil {
		s.mu.Unlock()
		return taken{}, err
	}
	if tk := s.takes[id]; tk != nil {
		t := taken{id: id, rev: s.rev}
		if b := s.bins[tk.bin]; b != nil {
			for _, it := range b.items {
				if it.take == id {
					t.items = append(t.items, it)
				}
			}
		}
		tk.expires = time.Now().Add(timeout)
		s.mu.Unlock()
		return t, s.waitRead(t.rev)
	}
	if err := s.spentLocked(id); err != nil {
		s.mu.Unlock()
		return taken{}, err
	}
	s.mu.Unlock()
	return s.takeItemsAs(bin, id, true, timeout)
}

// spentLocked is ErrExpired when the take id was acknowledged or given
// back already: a Get of that id, arriving late or again, must not take
// the bin's items. s.mu is held; takeItemsAs asks again under the lock it
// makes the take in, since an ack may land while it was released.
func (s *Store) spentLocked(id uint64) error {
	if s.acked.has(id) {
		return errorf(ErrExpired, "Get %x was acknowledged already", id)
	}
	if s.dropped.has(id) {
		return errorf(ErrExpired, "Get %x was given back already", id)
	}
	return nil
}

func (svc *Service) ack(_ context.Context, req ackRequest) (revResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return revResponse{}, err
	}
	if req.Drop {
		s := st.Item
		s.mu.Lock()
		s.dropTakeLocked(req.Take)
		// The take itself may still be on its way (its caller gave up
		// waiting for the reply): it must not hold the items after this.
		s.dropped.add(req.Take)
		s.mu.Unlock()
		if testAfterDrop != nil {
			testAfterDrop(req.Take)
		}
		return revResponse{}, nil
	}
	rev, err := st.Item.ackTake(req.Take)
	return revResponse{Rev: rev}, err
}

func (svc *Service) list(ctx context.Context, req storeRequest) (listResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return listResponse{}, err
	}
	bins, rev, err := st.Item.List(ctx)
	return listResponse{Bins: bins, Rev: rev}, err
}

func (svc *Service) delete(_ context.Context, req deleteRequest) (revResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return revResponse{}, err
	}
	rev, err := st.Item.deleteBin(req.Bin, req.Req)
	return revResponse{Rev: rev}, err
}

func (svc *Service) publish(_ context.Context, req publishRequest) (publishResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return publishResponse{}, err
	}
	if err := CheckName(req.Name); err != nil {
		return publishResponse{}, err
	}
	if e, done, err := st.Item.answered(req.Req); err != nil || done {
		return publishResponse{Version: e.Version, Rev: e.Rev}, err
	}
	in, err := st.Item.ingestMsg(req.Value, true)
	if err != nil {
		return publishResponse{}, err
	}
	v, rev, err := st.Item.publishValue(req.Name, in, req.Req)
	return publishResponse{Version: v, Rev: rev}, err
}

func (svc *Service) read(ctx context.Context, req readRequest) (readResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return readResponse{}, err
	}
	s := st.Item
	// Bytes are leased too, for the time the response takes to arrive: the
	// client releases the lease once it has them.
	info, err := s.readVersion(ctx, req.Name, req.After, req.Wait, s.opts.LeaseTTL)
	if err != nil {
		return readResponse{}, err
	}
	resp := readResponse{Version: info.v, Lease: info.lease, LeaseMS: s.opts.LeaseTTL.Milliseconds()}
	if req.Refs && st.Rel != "" {
		resp.Path = valuesDir + "/" + filepath.Base(s.valuePath(info.id))
		return resp, nil
	}
	td, err := s.mapping(info.id)
	if err != nil {
		s.release(info.lease)
		return readResponse{}, err
	}
	resp.TD = &rpc.TD{TensorDict: td}
	return resp, nil
}

func (svc *Service) renew(_ context.Context, req renewRequest) (renewResponse, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return renewResponse{}, err
	}
	return renewResponse{Lost: st.Item.renew(req.Leases, st.Item.opts.LeaseTTL)}, nil
}

func (svc *Service) release(_ context.Context, req releaseRequest) (rpc.Empty, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return rpc.Empty{}, err
	}
	for _, id := range req.Leases {
		st.Item.release(id)
	}
	return rpc.Empty{}, nil
}

func (svc *Service) watch(ctx context.Context, req watchRequest, st *rpc.ServerStream[rpc.Empty, watchMessage]) error {
	sv, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return err
	}
	after, sent := req.After, uint64(0)
	for {
		// Wait for events; when none come for a while, tell the watcher
		// how far the node has looked, so that a watcher that reconnects
		// resumes from there.
		evs, seen, err := sv.Item.watchEvents(ctx, req.ID, req.Prefix, after, watchMaxWait)
		if err != nil {
			return err
		}
		if len(evs) > 0 || seen > sent {
			// Send waits while the watcher is slow (the stream's window);
			// meanwhile the node keeps no events for it beyond History.
			if err := st.Send(ctx, watchMessage{Events: evs, Seen: seen}); err != nil {
				return err
			}
			sent = seen
		}
		after = seen
	}
}

func (svc *Service) stats(_ context.Context, req storeRequest) (Stats, error) {
	st, err := svc.stores.Lookup(req.Store)
	if err != nil {
		return Stats{}, err
	}
	return st.Item.Stats(), nil
}

// validValuePath reports whether p is a value's path as the node sends it.
func validValuePath(p string) bool {
	name, ok := strings.CutPrefix(p, valuesDir+"/")
	if !ok {
		return false
	}
	_, ok = parseValueName(name)
	return ok && strings.ToLower(name) == name
}
