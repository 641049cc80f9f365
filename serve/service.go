package serve

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The methods of the serve service (docs/serve.md describes their
// messages). Every request names the model it is for.
const (
	MethodInfo       = "serve.info"
	MethodRegister   = "serve.register"
	MethodRenew      = "serve.renew"
	MethodUnregister = "serve.unregister"
	MethodPredict    = "serve.predict"
	MethodStats      = "serve.stats"
)

// repeatable marks the methods a client sends again when the connection
// broke after their request may have reached the node (service.Methods).
// Renew, Unregister and Failure are not: a client sends them once, and
// handles their failure itself.
var repeatable = service.Methods{
	MethodInfo:  true, // reads
	MethodStats: true,
	// A registration whose reply was lost expires with its lease, as
	// etcd's LeaseGrant does.
	MethodRegister: true,
	// The model runs again on the same rows, into the same slots.
	MethodPredict: true,
}

// ClientsDir is where, under the shared root, clients that share the
// node's filesystem keep their slots: ClientsDir/ID/{in,out,lock}, a
// folder per client, ID 16 hexadecimal digits. The client makes and
// removes its folder; a node removes the folder of a client whose lease
// ran out and whose lock is free (the client died).
const ClientsDir = ".tensorwire-serve/clients"

// clientDirRE is the only form of registered prefix a node accepts: it
// maps no other files, and removes no other folder.
var clientDirRE = regexp.MustCompile(`^\.tensorwire-serve/clients/[0-9a-f]{16}$`)

// bellDirRE is the only form of bell folder a client accepts.
var bellDirRE = regexp.MustCompile(`^\.tensorwire-serve/nodes/[0-9a-f]{16}$`)

// Service is the serve service of an rpc.Server: the managers it serves,
// by name, to clients that Dial them.
//
// A Service is safe for concurrent use; managers can be added and removed
// while it serves.
type Service struct {
	root   string   // the server's root; "" if none
	rootFS *os.Root // opened on root: client files are mapped through it
	models *service.Registry[*served]
}

// served is a manager and its clients' registrations.
type served struct {
	name  string
	root  string // the server's root
	m     *Manager
	lease time.Duration

	mu        sync.Mutex
	clients   map[uint64]*registration
	timer     *time.Timer // the next sweep of expired leases; nil when none is due
	removed   bool
	bell      *nodeBell                       // nil until a client registers a ring
	rings     atomic.Pointer[[]*registration] // the registrations with rings, for the poller
	deadRings []*registration                 // dropped, their rings still mapped
	// pollerDone: the poller stopped (the bell closed); the last release of a
	// dropped registration unmaps its ring, which the poller left mapped.
	pollerDone bool
}

// registration is a client's slots, mapped by the node: rows [0, slots) of
// in and out, the client's files.
type registration struct {
	id      uint64
	prefix  string // relative to the root
	slots   int
	in, out *tensordict.TensorDict
	inF     fields // their tensors
	outF    fields
	ring    *ringView // the client's ring; nil if it has none
	expires time.Time
	refs    int  // requests using the mappings
	gone    bool // removed from the map: unmap once refs is 0, and write none of its rows or records
	// failures are the errors of requests by bell, by first row, until
	// the client fetches them (serve.failure).
	failures map[int]failure
	// latest[start] is the sequence number of the newest request by bell
	// the node took for rows from start (nil until the first): an older
	// one's answer, late, is not written over the newer request's rows.
	latest []uint32
}

// Register adds the serve service's methods to s and returns the Service,
// empty: Add managers to it. Call it once per server.
func Register(s *rpc.Server) (*Service, error) {
	svc := &Service{root: s.Root(), models: service.NewRegistry[*served](s, service.Spec{
		Pkg: "serve", Kind: "model", Config: ErrConfig, Exists: ErrExists, NotFound: ErrNotFound,
	}, nil)}
	if svc.root != "" {
		r, err := os.OpenRoot(svc.root)
		if err != nil {
			return nil, fmt.Errorf("serve: opening the root: %w", err)
		}
		svc.rootFS = r
	}
	regs := []error{
		rpc.Register(s, MethodInfo, svc.info),
		rpc.Register(s, MethodRegister, svc.register),
		rpc.Register(s, MethodRenew, svc.renew),
		rpc.Register(s, MethodUnregister, svc.unregister),
		rpc.Register(s, MethodPredict, svc.predict),
		rpc.Register(s, MethodStats, svc.stats),
		rpc.Register(s, MethodFailure, svc.failure),
		rpc.RegisterStream(s, MethodReplica, svc.replica),
	}
	for _, err := range regs {
		if err != nil {
			return nil, err
		}
	}
	return svc, nil
}

// Add serves m under name. m stays the caller's: Remove it (or close the
// server) before closing it. A name already served is ErrExists.
func (svc *Service) Add(name string, m *Manager) error {
	return svc.models.Add(name, &served{name: name, root: svc.root, m: m, lease: m.cfg.Lease, clients: map[uint64]*registration{}})
}

// Remove stops serving the model named name: calls for it fail with
// ErrNotFound from then on, and its clients' mappings are dropped once
// the requests using them end. Requests by bell in a batch then are not
// answered and write no rows: their clients find the model gone, or send
// them again to a node that serves it.
func (svc *Service) Remove(name string) {
	s, ok := svc.models.Remove(name)
	if !ok {
		return
	}
	s.mu.Lock()
	s.removed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	for id, r := range s.clients {
		delete(s.clients, id)
		s.dropLocked(r)
	}
	nb := s.bell
	s.mu.Unlock()
	if nb != nil {
		nb.close()
	}
}

// Close stops serving every model, as Remove does for each: it stops the
// bells' pollers and removes their folders. Call it after closing the
// server, before closing the managers.
func (svc *Service) Close() error {
	for _, name := range svc.models.Names() {
		svc.Remove(name)
	}
	if svc.rootFS != nil {
		return svc.rootFS.Close()
	}
	return nil
}

func (svc *Service) lookup(name string) (*served, error) {
	e, err := svc.models.Lookup(name)
	return e.Item, err
}

// The messages. Field names on the wire are the codec tags.
type (
	infoRequest struct {
		Name string `codec:"name"`
	}
	infoResponse struct {
		Input    tensordict.RowSchema `codec:"input"`
		Output   tensordict.RowSchema `codec:"output"`
		MaxBatch int                  `codec:"max_batch"`
		Replicas int                  `codec:"replicas"`
		Policy   string               `codec:"policy"`
		LeaseMS  int64                `codec:"lease_ms"`
		Version  uint64               `codec:"version"`
	}
	registerRequest struct {
		Name   string `codec:"name"`
		Prefix string `codec:"prefix"` // the client's folder, relative to the node's root
		Slots  int    `codec:"slots"`
		Ring   bool   `codec:"ring"` // the folder holds a ring: requests may come by bell
	}
	registerResponse struct {
		Client  uint64 `codec:"client"`
		LeaseMS int64  `codec:"lease_ms"`
		Bell    string `codec:"bell"` // the bell's folder, relative to the root; "" when requests come by call only
	}
	clientRequest struct {
		Name   string `codec:"name"`
		Client uint64 `codec:"client"`
	}
	predictRequest struct {
		Name   string  `codec:"name"`
		Client uint64  `codec:"client"` // 0: the rows are in In
		Start  int     `codec:"start"`  // by reference: the client's rows [start, start+n)
		N      int     `codec:"n"`
		In     *rpc.TD `codec:"in"` // bytes mode: the input rows
	}
	predictResponse struct {
		Version uint64  `codec:"version"`
		Out     *rpc.TD `codec:"out"` // bytes mode: the output rows
	}
)

func (svc *Service) info(_ context.Context, req infoRequest) (infoResponse, error) {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return infoResponse{}, err
	}
	c := s.m.cfg
	return infoResponse{
		Input: c.Input, Output: c.Output, MaxBatch: c.MaxBatch, Replicas: c.Replicas,
		Policy: policyName(c.Policy), LeaseMS: s.lease.Milliseconds(), Version: s.m.Version(),
	}, nil
}

func (svc *Service) register(ctx context.Context, req registerRequest) (registerResponse, error) {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return registerResponse{}, err
	}
	// The client's slots, ring and bell are rewritten in place by both
	// sides: only one page cache shows each side the other's writes.
	if err := rpc.RequireCoherent(ctx, "serve: slots in a shared folder"); err != nil {
		return registerResponse{}, err
	}
	switch {
	case svc.rootFS == nil:
		return registerResponse{}, rpc.Errorf(rpc.FailedPrecondition, "serve: this node has no shared root: send the rows as bytes")
	case !clientDirRE.MatchString(req.Prefix):
		return registerResponse{}, schemaErrorf("client folder %q; want %s/ and 16 hexadecimal digits", req.Prefix, ClientsDir)
	case req.Slots < 1 || req.Slots > maxRows:
		return registerResponse{}, schemaErrorf("%d slots; want 1 to %d", req.Slots, maxRows)
	}
	dir := filepath.Join(svc.root, filepath.FromSlash(req.Prefix))
	// The client's folder, reached without following a link, and the files
	// in it through an os.Root on it: none is mapped from elsewhere.
	cr, err := openPath(svc.rootFS, req.Prefix)
	if err != nil {
		return registerResponse{}, schemaErrorf("the client's folder: %v", err)
	}
	defer cr.Close()
	in, err := svc.mapClient(cr, filepath.Join(dir, "in"), s.m.cfg.Input, req.Slots, "input")
	if err != nil {
		return registerResponse{}, err
	}
	out, err := svc.mapClient(cr, filepath.Join(dir, "out"), s.m.cfg.Output, req.Slots, "output")
	if err != nil {
		in.Close()
		return registerResponse{}, err
	}
	r := &registration{id: rand.Uint64() | 1, prefix: req.Prefix, slots: req.Slots, in: in, out: out}
	if r.inF, err = fieldsOf(in, s.m.cfg.Input); err == nil {
		r.outF, err = fieldsOf(out, s.m.cfg.Output)
	}
	if err == nil && req.Ring && bellSupported {
		if r.ring, err = svc.mapRing(cr, req.Slots); err != nil {
			err = schemaErrorf("the client's ring: %v", err)
		}
	}
	if err != nil {
		in.Close()
		out.Close()
		return registerResponse{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		in.Close()
		out.Close()
		if r.ring != nil {
			unmapShared(r.ring.b)
		}
		return registerResponse{}, fmt.Errorf("%w named %q on this node", ErrNotFound, req.Name)
	}
	for id, old := range s.clients {
		if old.prefix == r.prefix { // registered again: the node restarted, or a lease ran out
			delete(s.clients, id)
			s.dropLocked(old)
		}
	}
	r.expires = time.Now().Add(s.lease)
	resp := registerResponse{Client: r.id, LeaseMS: s.lease.Milliseconds()}
	if r.ring != nil {
		nb, err := s.ensureBellLocked()
		if err != nil {
			// Requests by call only.
			s.m.log.Warn("serve: no bell for requests by reference; they come by call", "model", s.name, "err", err)
			unmapShared(r.ring.b)
			r.ring = nil
		} else {
			resp.Bell = nb.rel
		}
	}
	s.clients[r.id] = r
	s.updateRingsLocked()
	if s.timer == nil {
		s.timer = time.AfterFunc(s.lease/4, s.sweep)
	}
	return resp, nil
}

// mapClient maps a client's input or output slots, read-write, through
// cr, an os.Root on the client's folder, and checks them: batch size
// [slots], schema's fields.
func (svc *Service) mapClient(cr *os.Root, prefix string, schema tensordict.RowSchema, slots int, what string) (*tensordict.TensorDict, error) {
	td, err := tensordict.LoadMemmap(prefix, tensordict.InRoot(cr))
	if err != nil {
		return nil, schemaErrorf("the client's %s slots: %v", what, err)
	}
	if b := td.BatchSize(); !slices.Equal(b, []int{slots}) {
		td.Close()
		return nil, schemaErrorf("the client's %s slots %s have batch size %v; the registration says %d slots ([%d])", what, prefix, b, slots, slots)
	}
	if d := schemaDiff(schema, td.RowSchema()); d != "" {
		td.Close()
		return nil, schemaErrorf("the client's %s slots %s do not fit the model's %s schema: %s", what, prefix, what, d)
	}
	return td, nil
}

// dropLocked unmaps r once no request uses it (its ring, the poller
// does, or the last release once the poller stopped). From now on no
// request by bell writes r's output rows or records (serveEntry): the
// client sends them again once it registers again, and may reuse the rows
// meanwhile. s.mu is held.
func (s *served) dropLocked(r *registration) {
	r.gone = true
	if r.refs == 0 {
		r.in.Close()
		r.out.Close()
	}
	if r.ring != nil {
		s.updateRingsLocked()
		s.deadRings = append(s.deadRings, r)
	}
}

// sweep drops the registrations whose lease ran out, and removes the
// folders of those whose client is dead.
func (s *served) sweep() {
	now := time.Now()
	var dead []string
	s.mu.Lock()
	for id, r := range s.clients {
		if now.After(r.expires) {
			delete(s.clients, id)
			s.dropLocked(r)
			dead = append(dead, r.prefix)
		}
	}
	if len(s.clients) > 0 && !s.removed {
		s.timer.Reset(s.lease / 4)
	} else {
		s.timer = nil
	}
	s.mu.Unlock()
	for _, p := range dead {
		// A live client holds its lock for as long as it runs: only a dead
		// client's folder is removed.
		removed := removeIfDead(s.root, p)
		s.m.log.Info("serve: a client's lease ran out", "model", s.name, "client", p, "dead_and_removed", removed)
	}
}

// acquire returns the registration id for a request, renewing its lease.
func (s *served) acquire(id uint64) (*registration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.clients[id]
	if r == nil {
		return nil, fmt.Errorf("%w: client %x on model %q (its lease ran out, or the node restarted)", ErrNotRegistered, id, s.name)
	}
	r.refs++
	r.expires = time.Now().Add(s.lease)
	return r, nil
}

func (s *served) release(r *registration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(r)
}

// releaseLocked ends a request's reference on r, unmapping r if it was
// the last of a dropped registration. s.mu is held.
func (s *served) releaseLocked(r *registration) {
	if r.refs--; r.refs == 0 && r.gone {
		r.in.Close()
		r.out.Close()
		if r.ring != nil && s.pollerDone {
			unmapShared(r.ring.b)
		}
	}
}

func (svc *Service) renew(_ context.Context, req clientRequest) (rpc.Empty, error) {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return rpc.Empty{}, err
	}
	r, err := s.acquire(req.Client)
	if err != nil {
		return rpc.Empty{}, err
	}
	s.release(r)
	return rpc.Empty{}, nil
}

func (svc *Service) unregister(_ context.Context, req clientRequest) (rpc.Empty, error) {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return rpc.Empty{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.clients[req.Client]; r != nil {
		delete(s.clients, req.Client)
		s.dropLocked(r)
	}
	return rpc.Empty{}, nil
}

func (svc *Service) predict(ctx context.Context, req predictRequest) (predictResponse, error) {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return predictResponse{}, err
	}
	m := s.m
	if req.Client == 0 {
		var in *tensordict.TensorDict
		if req.In != nil {
			in = req.In.TensorDict
		}
		var out *tensordict.TensorDict
		n, err := checkRows(in, m.cfg.Input, m.cfg.MaxBatch, "input")
		if err != nil {
			return predictResponse{}, err
		}
		src, err := fieldsOf(in, m.cfg.Input)
		if err != nil {
			return predictResponse{}, err
		}
		v, err := m.run(ctx, n,
			func(buf fields, row int) error { return copyRows(buf, row, src, 0, n) },
			func(res *tensordict.TensorDict, _ fields, row int) (err error) {
				out, err = res.Slice(row, row+n) // the model's, never reused: sent as it is
				return err
			})
		if err != nil {
			return predictResponse{}, err
		}
		return predictResponse{Version: v, Out: &rpc.TD{TensorDict: out}}, nil
	}
	r, err := s.acquire(req.Client)
	if err != nil {
		return predictResponse{}, err
	}
	defer s.release(r)
	n := req.N
	switch {
	case n < 1 || n > m.cfg.MaxBatch:
		return predictResponse{}, schemaErrorf("a request of %d rows; want 1 to %d (the max batch)", n, m.cfg.MaxBatch)
	case req.Start < 0 || req.Start > r.slots-n:
		return predictResponse{}, schemaErrorf("rows [%d, %d) of a client's %d slots", req.Start, req.Start+n, r.slots)
	}
	v, err := m.run(ctx, n,
		func(buf fields, row int) error { return copyRows(buf, row, r.inF, req.Start, n) },
		func(_ *tensordict.TensorDict, res fields, row int) error {
			return copyRows(r.outF, req.Start, res, row, n)
		})
	return predictResponse{Version: v}, err
}

// Stats returns the Stats of the model served as name, with its remote
// clients (Clients), as Client.Stats gets them; ErrNotFound when none is.
func (svc *Service) Stats(name string) (Stats, error) {
	return svc.stats(context.Background(), infoRequest{Name: name})
}

func (svc *Service) stats(_ context.Context, req infoRequest) (Stats, error) {
	s, err := svc.lookup(req.Name)
	if err != nil {
		return Stats{}, err
	}
	st := s.m.Stats()
	s.mu.Lock()
	st.Clients = len(s.clients)
	s.mu.Unlock()
	return st, nil
}
