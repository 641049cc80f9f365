package collective

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// Comm is a communicator: a group of Size ranks, each a process (or a
// Comm of its own in one process), that run collectives together. Every
// rank calls the same collectives in the same order; each call returns
// when this rank's part is done.
//
// A Comm runs one collective at a time: calls from several goroutines are
// serialized, in the order they take its lock, which must then be the same
// on every rank. Point-to-point calls (Send, Recv, Isend, Irecv) run
// concurrently with each other and with collectives.
//
// A Comm is broken for good once a rank is lost or an operation fails
// part-way (ErrPeerLost, ErrAborted, a context that ended in the middle):
// every later call fails with ErrBroken. Close it and Join again. Errors
// found before any data moved (ErrArgument, ErrMismatch) leave it usable.
type Comm struct {
	cfg     Config
	rank    int
	size    int
	session uint64
	addrs   []string
	log     *slog.Logger

	srv   *rpc.Server
	ln    net.Listener
	ready chan struct{} // closed when the communicator has formed
	box   *mailbox

	cmu     sync.Mutex
	clients []*rpc.Client

	shm   *shmGroup  // nil: TCP, or a hierarchy
	hier  *hierState // nil: not a hierarchy (hier_*.go)
	hosts []int      // host index per rank (Topology)

	opMu sync.Mutex // one collective at a time
	seq  uint64     // collectives started, guarded by opMu

	p2pMu   sync.Mutex
	sendSeq map[p2pKey]uint64
	recvSeq map[p2pKey]uint64
	p2pOut  p2pOut      // this rank's arenas for messages by reference (p2p_shm.go)
	p2pIn   p2pIn       // its mappings of the others'
	p2pStat p2pStats    // messages by reference sent and received
	inboxes peerInboxes // the others' inboxes, where its messages by reference are announced (p2p_inbox.go)

	broken    atomic.Pointer[error]
	ownAbort  atomic.Pointer[error] // the ErrAborted this rank broke the communicator with (its context ended, or an error of its own), as the others see it
	ownCause  error                 // ... and as this rank says it; written once, by failOwn, before ownAbort
	broke     context.Context       // ends when the communicator breaks (failOwn); a cancel context, so that context.AfterFunc on it starts no goroutine
	markBroke context.CancelFunc    // ends broke
	abandoned chan struct{}         // closed when this rank broke off a collective part-way
	completed atomic.Uint64         // collectives completed
	inflight  atomic.Int64          // the collective running, or -1
	goneAt    []atomic.Uint64       // rank j closed after goneAt[j]-1 collectives; 0: it has not
	gone      []chan struct{}       // gone[j] closed once rank j closed (with goneAt[j]): its receives fail
	closed    atomic.Bool
	closing   chan struct{} // closed by Close: the watch handlers return
	watchers  atomic.Int32  // watch handlers running
	watchCtx  context.Context
	stopW     context.CancelFunc
	wg        sync.WaitGroup

	join *joinState // rank 0: the rendezvous
}

type p2pKey struct {
	peer int
	tag  int
}

// Rank returns this rank, 0 to Size-1.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.size }

// Transport returns the transport the ranks agreed on: SHM, TCP, or Hier
// (shared mappings within each host, TCP between hosts; Topology says
// which ranks are where).
func (c *Comm) Transport() Transport {
	switch {
	case c.shm != nil:
		return SHM
	case c.hier != nil:
		return Hier
	}
	return TCP
}

// Addr returns the address this rank listens on for its peers.
func (c *Comm) Addr() string { return c.addrs[c.rank] }

// authLinger is how long rank 0 goes on answering join calls with the
// failure that ended its rendezvous (a token refused, a rank of another
// protocol), before its Join returns it.
const authLinger = time.Second

// rpcMsg returns err's message without the "rpc: Code: " prefix an
// *rpc.Error adds, so that a message that quotes another says its code
// once.
func rpcMsg(err error) string {
	var e *rpc.Error
	if errors.As(err, &e) && e.Msg != "" {
		return e.Msg
	}
	return fmt.Sprint(err)
}

// detail returns err's message without the "rpc: Code: " prefix and
// sentinel's text before it: what an error that wraps sentinel itself
// adds, so that it says sentinel once.
func detail(err, sentinel error) string {
	return strings.TrimPrefix(rpcMsg(err), sentinel.Error()+": ")
}

// rpc methods.
const (
	methodJoin  = "collective.join"
	methodReady = "collective.ready"
	methodWatch = "collective.watch"
	methodMsg   = "collective.msg"
)

type joinReq struct {
	Rank      int    `codec:"rank"`
	Size      int    `codec:"size"`
	Addr      string `codec:"addr"`
	Host      string `codec:"host"`
	Dir       string `codec:"dir"`
	Transport string `codec:"transport"`
	// Hier: this rank's build can form a hierarchical communicator (rank
	// 0 proposes one only if every rank can).
	Hier bool `codec:"hier,omitempty"`
	// Proto is the data protocol this rank's build speaks (protoVersion;
	// left out, 0, by builds before it was sent). Rank 0 refuses a rank
	// whose Proto differs from its own, failing every rank's Join.
	Proto int `codec:"proto,omitempty"`
}

// protoVersion numbers the algorithms, and so the data messages, of this
// build's collectives: ranks of one communicator must run the same ones
// (docs/protocol.md, "collective.join"). 0: the ring Allreduce over TCP
// (builds before 2026-11-29); 1: the direct Allreduce up to 8 ranks, the
// hierarchy's messages; 2: the pipelined Allreduce, Reduce and
// ReduceScatter through shared mappings (shm_pipe.go, shm_rspipe.go: data
// files of a few chunks, progress words); 3: a hierarchy's Bcast and
// Allgather by levels (hier_move.go: between hosts only, through the
// hosts' mappings within them); 4: a hierarchy's Reduce and ReduceScatter
// by levels (hier_reduce.go); 5: a hierarchy's Gather, Scatter and
// Alltoall by levels (hier_gather.go, hier_alltoall.go); 6: point-to-point
// messages by reference between ranks that share a folder (p2p_shm.go: one
// message with the dtype, shape and a reference into the sender's p2p
// file, instead of the bytes); 7: an Allreduce of shared buffers read and
// written in place (shm_shared_linux.go: reference words in the control
// file, the buffers' files in the folder, the reduced phase); 8: a
// point-to-point message of a shared buffer by a reference to the buffer
// (p2pRef.Buf); 9: point-to-point messages by reference announced and
// answered through the receiver's inbox file (p2p_inbox.go), not rpc; 10: a
// point-to-point message of at most wholeMax bytes not by reference sent
// whole, its bytes beside its dtype and shape in one call. Raise it with
// any change to
// what a data message carries at a step, or to how the ranks use the
// shared mappings.
const protoVersion = 10

type joinResp struct {
	Session uint64   `codec:"session"`
	Addrs   []string `codec:"addrs"`
	Shm     string   `codec:"shm"` // the session's folder when the ranks try shared mappings
	// Hosts is every rank's host index (groupHosts); Hier: the ranks try a
	// hierarchy over it.
	Hosts []int `codec:"hosts,omitempty"`
	Hier  bool  `codec:"hier,omitempty"`
}

type readyReq struct {
	Session uint64 `codec:"session"`
	Rank    int    `codec:"rank"`
	Err     string `codec:"err"` // why this rank cannot use the shared mappings
}

type readyResp struct {
	Shm bool   `codec:"shm"`
	Why string `codec:"why"`
	// Hier: the communicator is hierarchical (every rank opened its
	// host's mappings).
	Hier bool `codec:"hier,omitempty"`
}

type watchReq struct {
	Session uint64 `codec:"session"`
	Rank    int    `codec:"rank"`
}

// watchResp ends a watch when its rank closes: after Done collectives.
type watchResp struct {
	Done uint64 `codec:"done"`
}

// joinState is rank 0's side of the rendezvous.
type joinState struct {
	mu      sync.Mutex
	reqs    []*joinReq
	n       int
	all     chan struct{} // every rank has joined
	resp    joinResp
	readies []*readyReq
	nready  int
	allRdy  chan struct{}
	rresp   readyResp
	shmErr  string        // why rank 0 could not make the session folder
	failed  error         // why the rendezvous ended without forming (a peer failed to authenticate)
	failCh  chan struct{} // closed with failed set
}

// fail ends the rendezvous with err: every join and ready call waiting,
// and every later one, returns it. The first cause wins.
func (j *joinState) fail(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed == nil {
		j.failed = err
		close(j.failCh)
	}
}

// Join forms a communicator with the other ranks: every rank calls it with
// the same Size and rendezvous and its own Rank, and it returns once all
// have arrived, or fails when ctx ends first (ErrJoin). Rank 0 listens on
// the rendezvous address; the others retry reaching it until ctx ends, so
// the ranks may start in any order. A bad Config is ErrConfig. A token
// refused between a rank and rank 0 is final: Join fails with
// ErrUnauthenticated at once on that rank and on the ranks waiting at
// rank 0, and on rank 0 a second later (it answers late ranks meanwhile),
// whatever ctx's deadline.
//
// The ranks use shared mappings when Config.Transport allows and every
// rank is on this host (same kernel boot and host name) and sees the
// folder rank 0 made under ShmDir; a hierarchy (Hier: shared mappings
// within each host, TCP between hosts) when they are on several hosts and
// some host has two or more; otherwise TCP. Comm.Topology says which.
func Join(ctx context.Context, cfg Config) (*Comm, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	c := &Comm{
		cfg: cfg, rank: cfg.Rank, size: cfg.Size,
		log:       cfg.Logger,
		ready:     make(chan struct{}),
		abandoned: make(chan struct{}),
		goneAt:    make([]atomic.Uint64, cfg.Size),
		gone:      make([]chan struct{}, cfg.Size),
		closing:   make(chan struct{}),
		sendSeq:   map[p2pKey]uint64{},
		recvSeq:   map[p2pKey]uint64{},
		clients:   make([]*rpc.Client, cfg.Size),
	}
	for j := range c.gone {
		c.gone[j] = make(chan struct{})
	}
	c.inflight.Store(-1)
	c.broke, c.markBroke = context.WithCancel(context.Background())
	c.watchCtx, c.stopW = context.WithCancel(context.Background())
	c.box = newMailbox(c)
	if err := c.listen(ctx); err != nil {
		c.stopW()
		return nil, err
	}
	if err := c.rendezvous(ctx); err != nil {
		if c.join != nil && c.join.ended() {
			// Rank 0 ended the rendezvous (a token refused, a rank of
			// another protocol): answer the ranks that call
			// it a while longer with why, rather than leave them retrying
			// a closed port (a program whose Join failed often exits at
			// once, so this waits here, not in the background).
			t := time.NewTimer(authLinger)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		c.shutdown()
		return nil, err
	}
	close(c.ready)
	if b := c.ownInbox(); b != nil {
		b.start(c)
	}
	for j := range c.size {
		if j != c.rank {
			c.wg.Add(1)
			go c.watch(j)
		}
	}
	c.log.Info("collective: joined", "rank", c.rank, "size", c.size, "transport", c.Transport())
	return c, nil
}

func (c *Comm) rpcOpts() []rpc.Option {
	var o []rpc.Option
	if c.cfg.Token != nil {
		o = append(o, rpc.WithToken(c.cfg.Token))
	}
	if c.cfg.TLS != nil {
		o = append(o, rpc.WithTLS(c.cfg.TLS))
	}
	if c.cfg.KeepAlive != 0 {
		o = append(o, rpc.WithKeepAlive(c.cfg.KeepAlive))
	}
	o = append(o, rpc.WithLogger(c.log))
	return o
}

// listen starts this rank's rpc server.
func (c *Comm) listen(ctx context.Context) error {
	addr, err := c.cfg.listenAddr()
	if err != nil {
		return err
	}
	srv, err := rpc.NewServer(append(c.rpcOpts(), rpc.WithAuthFailure(c.authFailed))...)
	if err != nil {
		return errorf(ErrConfig, "%v", err)
	}
	if c.rank == 0 {
		c.join = &joinState{reqs: make([]*joinReq, c.size), all: make(chan struct{}),
			readies: make([]*readyReq, c.size), allRdy: make(chan struct{}), failCh: make(chan struct{})}
		rpc.Register(srv, methodJoin, c.handleJoin)
		rpc.Register(srv, methodReady, c.handleReady)
	}
	rpc.Register(srv, methodWatch, c.handleWatch)
	rpc.Register(srv, methodMsg, c.box.handle)
	var l net.Listener
	if c.rank == 0 || len(c.cfg.Peers) > 0 {
		// A fixed address: the previous communicator's port may still be
		// closing.
		l, err = listenRetry(ctx, addr)
	} else {
		l, err = listenBeside(addr, c.cfg.rendezvous())
	}
	if err != nil {
		return errorf(ErrJoin, "rank %d: listen on %s: %v", c.rank, addr, err)
	}
	c.srv, c.ln = srv, l
	go srv.Serve(l)
	return nil
}

// authFailed is called by this rank's server for a peer it refused for
// its token. At rank 0, before the communicator formed, it ends the
// rendezvous on every rank: a rank that cannot authenticate will never
// join, so waiting for it would only hang.
func (c *Comm) authFailed(remote string, err error) {
	c.log.Warn("collective: a peer failed to authenticate", "rank", c.rank, "peer", remote, "err", err)
	if c.join == nil {
		return
	}
	select {
	case <-c.join.all:
		return // every rank joined, so authenticated: a stranger
	default:
	}
	c.join.fail(errorf(ErrUnauthenticated, "rank 0 (%s) refused a peer at %s: %s; every rank must have the same Config.Token",
		c.cfg.rendezvous(), remote, rpcMsg(err)))
}

// hostID names this machine's kernel: ranks with the same id share memory.
func hostID() string {
	h, _ := os.Hostname()
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "host:" + h
	}
	return strings.TrimSpace(string(b)) + "/" + h
}

// rendezvous finds the other ranks through rank 0 and agrees on the
// transport.
func (c *Comm) rendezvous(ctx context.Context) error {
	me := &joinReq{Rank: c.rank, Size: c.size, Addr: c.cfg.advertise(c.ln), Host: hostID(),
		Dir: c.cfg.shmDir(), Transport: string(c.cfg.Transport), Hier: true, Proto: protoVersion}
	var resp joinResp
	var err error
	if c.rank == 0 {
		resp, err = c.join.add(ctx, me, c)
	} else {
		err = c.callRoot(ctx, true, func(cl *rpc.Client) error {
			resp, err = rpc.Call[joinResp](ctx, cl, methodJoin, me)
			return err
		})
	}
	if err != nil {
		return err
	}
	c.session, c.addrs, c.hosts = resp.Session, resp.Addrs, resp.Hosts
	if len(c.hosts) != c.size {
		c.hosts = soloHosts(c.size)
	}
	// Shared mappings: each rank makes its segment and says whether it
	// sees rank 0's folder; all use them or none do.
	rr := &readyReq{Session: c.session, Rank: c.rank}
	var g *shmGroup
	var hg *hierState
	switch {
	case resp.Shm != "":
		g, err = openShm(c, resp.Shm)
		if err != nil {
			rr.Err = err.Error()
		}
	case resp.Hier:
		hg, err = c.hierOpen(ctx, c.hosts)
		if err != nil {
			rr.Err = err.Error()
		}
	default:
		rr.Err = "not tried"
	}
	var ready readyResp
	if c.rank == 0 {
		ready, err = c.join.ready(ctx, rr)
	} else {
		err = c.callRoot(ctx, false, func(cl *rpc.Client) error {
			ready, err = rpc.Call[readyResp](ctx, cl, methodReady, rr)
			return err
		})
	}
	if err != nil {
		if g != nil {
			g.close()
		}
		hg.close()
		return err
	}
	if resp.Hier {
		return c.hierReady(hg, ready)
	}
	if !ready.Shm {
		if g != nil {
			g.close()
		}
		if c.cfg.Transport == Hier {
			return errorf(ErrJoin, "a hierarchy required, but %s", ready.Why)
		}
		if c.cfg.Transport == SHM {
			return errorf(ErrJoin, "shared mappings required, but %s", ready.Why)
		}
		if resp.Shm != "" {
			c.log.Warn("collective: shared mappings unavailable; using TCP", "why", ready.Why)
		}
		return nil
	}
	if err := g.attach(); err != nil {
		g.close()
		return errorf(ErrJoin, "mapping the other ranks' segments: %v", err)
	}
	c.shm = g
	return nil
}

// callRoot calls rank 0; with retry, again and again until ctx ends while
// rank 0 is not reachable yet.
func (c *Comm) callRoot(ctx context.Context, retry bool, call func(*rpc.Client) error) error {
	delay := 10 * time.Millisecond
	var last error // the last failure not caused by ctx's end
	for {
		cl, err := c.client(ctx, 0)
		if err != nil && errors.Is(err, rpc.ErrUnauthenticated) {
			// Final: the tokens differ, and will on every try.
			return errorf(ErrUnauthenticated, "rank %d could not authenticate with rank 0 at %s: %s; every rank must have the same Config.Token",
				c.rank, c.cfg.rendezvous(), rpcMsg(err))
		}
		if err == nil {
			err = call(cl)
			if err == nil {
				return nil
			}
			if !retry || !errors.Is(err, rpc.ErrUnavailable) || errors.Is(err, ErrJoin) || errors.Is(err, ErrUnauthenticated) {
				if !errors.Is(err, ErrJoin) && !errors.Is(err, ErrUnauthenticated) {
					err = errorf(ErrJoin, "rank %d: rank 0 at %s: %s", c.rank, c.cfg.rendezvous(), rpcMsg(err))
				}
				return err
			}
			// Rank 0 is not there yet, or was restarting: dial afresh.
			c.cmu.Lock()
			c.clients[0] = nil
			c.cmu.Unlock()
			cl.Close()
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		if ctx.Err() != nil {
			return errorf(ErrJoin, "rank %d: rank 0 at %s not reached before the context ended (%v); the last try: %s",
				c.rank, c.cfg.rendezvous(), ctx.Err(), rpcMsg(last))
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// add records rank 0's own join and waits for the others.
func (j *joinState) add(ctx context.Context, r *joinReq, c *Comm) (joinResp, error) {
	if err := j.put(r, c); err != nil {
		return joinResp{}, err
	}
	return j.wait(ctx)
}

// handleJoin is collective.join: it records rank r.Rank's claim and
// waits for the others. A claim whose call ends before every rank joined
// (its caller's context ended, or its connection) is withdrawn, so that
// the rank may join again and the group does not form with an address no
// rank waits at (before, its next Join was refused as a second claim, and
// rank 0 counted the stale one). If the group forms at the moment the
// call ends, the claim stays in it: the others then wait for that rank's
// ready until their contexts end, as for any rank lost while forming.
func (c *Comm) handleJoin(ctx context.Context, r joinReq) (joinResp, error) {
	if err := c.join.put(&r, c); err != nil {
		return joinResp{}, err
	}
	resp, err := c.join.wait(ctx)
	if err != nil {
		c.join.drop(&r)
	}
	return resp, err
}

// drop withdraws claim r, whose join call ended without an answer, while
// the group has not formed: put counts claims and forms the group under
// the same lock, so a claim is either withdrawn or in the group. Nothing
// changes after the rendezvous failed, or once r is no longer its rank's
// claim.
func (j *joinState) drop(r *joinReq) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed != nil || isClosed(j.all) || j.reqs[r.Rank] != r {
		return
	}
	j.reqs[r.Rank] = nil
	j.n--
}

func (j *joinState) put(r *joinReq, c *Comm) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed != nil {
		return j.failed
	}
	if j.n == c.size {
		// This communicator formed already (and is perhaps closing, with
		// a new one about to listen here): the caller tries again.
		return rpc.Errorf(rpc.Unavailable, "collective: the communicator at %s has formed already", c.cfg.rendezvous())
	}
	switch {
	case r.Size != c.size:
		return errorf(ErrJoin, "rank %d says size %d, rank 0 %d", r.Rank, r.Size, c.size)
	case r.Rank < 0 || r.Rank >= c.size:
		return errorf(ErrJoin, "rank %d is not in [0, %d)", r.Rank, c.size)
	case r.Transport != string(c.cfg.Transport):
		return errorf(ErrJoin, "rank %d asks for transport %q, rank 0 %q", r.Rank, r.Transport, c.cfg.Transport)
	case j.reqs[r.Rank] != nil:
		return errorf(ErrJoin, "rank %d joined twice (from %s and %s)", r.Rank, j.reqs[r.Rank].Addr, r.Addr)
	case r.Proto != protoVersion:
		// Ranks of two builds would exchange data messages neither
		// expects: every rank's Join fails now rather than a collective
		// later.
		err := errorf(ErrJoin, "rank %d (%s) speaks collective protocol %d, rank 0 %d: every rank must run the same tensorwire release",
			r.Rank, r.Addr, r.Proto, protoVersion)
		j.failed = err
		close(j.failCh)
		return err
	}
	j.reqs[r.Rank] = r
	j.n++
	if j.n < c.size {
		return nil
	}
	var sid [8]byte
	rand.Read(sid[:])
	j.resp.Session = binary.LittleEndian.Uint64(sid[:]) | 1
	j.resp.Addrs = make([]string, c.size)
	shm := c.cfg.Transport == Auto || c.cfg.Transport == SHM
	keys := make([]string, c.size)
	for i, q := range j.reqs {
		j.resp.Addrs[i] = q.Addr
		keys[i] = hostKey(q)
		if q.Host != j.reqs[0].Host || q.Dir != j.reqs[0].Dir {
			shm = false
		}
	}
	j.resp.Hosts = groupHosts(keys)
	j.resp.Hier = !shm && j.hierOK(c.cfg.Transport)
	if shm {
		dir, err := makeSessionDir(j.reqs[0].Dir, j.resp.Session)
		if err != nil {
			c.log.Warn("collective: cannot make the shared folder", "err", err)
			j.shmErr = err.Error()
		} else {
			j.resp.Shm = dir
		}
	}
	close(j.all)
	return nil
}

// ended reports whether the rendezvous failed for every rank (fail, or a
// join of another protocol), as opposed to timing out here.
func (j *joinState) ended() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.failed != nil
}

func (j *joinState) wait(ctx context.Context) (joinResp, error) {
	select {
	case <-j.all:
		return j.resp, nil
	case <-j.failCh:
		return joinResp{}, j.failed
	case <-ctx.Done():
		j.mu.Lock()
		missing := []int{}
		for r, q := range j.reqs {
			if q == nil {
				missing = append(missing, r)
			}
		}
		j.mu.Unlock()
		return joinResp{}, errorf(ErrJoin, "%d of %d ranks did not join before the context ended (%v): ranks %s",
			len(missing), len(j.reqs), ctx.Err(), rankList(missing))
	}
}

func (j *joinState) ready(ctx context.Context, r *readyReq) (readyResp, error) {
	j.mu.Lock()
	if r.Session != j.resp.Session || r.Rank < 0 || r.Rank >= len(j.readies) || j.readies[r.Rank] != nil {
		j.mu.Unlock()
		return readyResp{}, errorf(ErrJoin, "unexpected ready from rank %d", r.Rank)
	}
	j.readies[r.Rank] = r
	j.nready++
	if j.nready == len(j.readies) {
		switch {
		case j.resp.Hier:
			j.rresp = j.hierVerdict()
		case j.resp.Shm == "" && j.shmErr != "":
			j.rresp.Why = "rank 0 cannot make the shared folder: " + j.shmErr
		case j.resp.Shm == "":
			j.rresp.Why = j.noHierWhy()
		default:
			j.rresp.Shm = true
			for _, q := range j.readies {
				if q.Err != "" {
					j.rresp.Shm = false
					j.rresp.Why = fmt.Sprintf("rank %d: %s", q.Rank, q.Err)
					break
				}
			}
		}
		close(j.allRdy)
	}
	j.mu.Unlock()
	select {
	case <-j.allRdy:
		return j.rresp, nil
	case <-j.failCh:
		return readyResp{}, j.failed
	case <-ctx.Done():
		return readyResp{}, errorf(ErrJoin, "the ranks did not all get ready: %v", ctx.Err())
	}
}

func (c *Comm) handleReady(ctx context.Context, r readyReq) (readyResp, error) {
	return c.join.ready(ctx, &r)
}

// client returns the rpc client for rank j, dialling it the first time.
func (c *Comm) client(ctx context.Context, j int) (*rpc.Client, error) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	if c.clients[j] != nil {
		return c.clients[j], nil
	}
	addr := c.cfg.rendezvous()
	if c.addrs != nil {
		addr = c.addrs[j]
	}
	cl, err := rpc.Dial(ctx, addr, c.rpcOpts()...)
	if err != nil {
		return nil, err
	}
	c.clients[j] = cl
	return cl, nil
}

// watch holds a call open on rank j for the communicator's life. It ends
// when j closes its communicator (a response saying after how many
// collectives), when j breaks off a collective part-way (ErrAborted), or
// when j dies or becomes unreachable (an rpc error): then j is gone.
func (c *Comm) watch(j int) {
	defer c.wg.Done()
	var err error
	var resp watchResp
	for attempt := 0; ; attempt++ {
		var cl *rpc.Client
		cl, err = c.client(c.watchCtx, j)
		if err == nil {
			resp, err = rpc.Call[watchResp](c.watchCtx, cl, methodWatch, watchReq{Session: c.session, Rank: c.rank})
		}
		if c.watchCtx.Err() != nil {
			return // we are closing
		}
		// A first dial may race the peer's listener on a busy machine;
		// only a connection that was up and then broke, or a clean
		// return, means the peer is gone.
		if err != nil && cl == nil && attempt < 3 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		break
	}
	switch {
	case err == nil:
		c.peerClosed(j, resp.Done)
	case errors.Is(err, ErrAborted):
		// j's own error says which rank broke off, which collective and
		// why: hand it on once, not wrapped in another.
		c.fail(errorf(ErrAborted, "%s", detail(err, ErrAborted)))
	default:
		c.fail(errorf(ErrPeerLost, "rank %d (%s) lost: %s", j, c.addrs[j], rpcMsg(err)))
	}
}

// peerClosed records that rank j closed its communicator after done
// collectives: a collective it did not complete cannot complete.
func (c *Comm) peerClosed(j int, done uint64) {
	if c.goneAt[j].Swap(done+1) == 0 {
		close(c.gone[j]) // and a receive from j waiting for a message fails (mailbox.wait)
	}
	if f := c.inflight.Load(); f >= 0 && uint64(f) >= done {
		c.fail(c.closedErr(j, done))
	}
}

func (c *Comm) closedErr(j int, done uint64) error {
	return errorf(ErrPeerLost, "rank %d closed its communicator after %d collectives", j, done)
}

// checkGone fails collective seq if a rank closed before it.
func (c *Comm) checkGone(seq uint64) error {
	for j := range c.goneAt {
		if g := c.goneAt[j].Load(); g != 0 && seq >= g-1 {
			err := c.closedErr(j, g-1)
			c.fail(err)
			return err
		}
	}
	return nil
}

func (c *Comm) handleWatch(ctx context.Context, r watchReq) (watchResp, error) {
	c.watchers.Add(1)
	defer c.watchers.Add(-1)
	select {
	case <-c.ready:
	case <-ctx.Done():
		return watchResp{}, ctx.Err()
	}
	if r.Session != c.session {
		return watchResp{}, errorf(ErrPeerLost, "rank %d watches session %x, this communicator is %x", r.Rank, r.Session, c.session)
	}
	select {
	case <-c.closing:
		return watchResp{Done: c.completed.Load()}, nil
	case <-c.abandoned:
		return watchResp{}, c.cause()
	case <-ctx.Done():
		return watchResp{}, ctx.Err()
	}
}

// fail breaks the communicator with err (the first cause wins) and wakes
// everything waiting.
func (c *Comm) fail(err error) bool { return c.failOwn(err, nil) }

// failOwn is fail; with own not nil, this rank breaks off: err is the
// ErrAborted the others see (its watches end with it) and own what this
// rank's calls say. Both are in place before anything waiting wakes.
func (c *Comm) failOwn(err, own error) bool {
	p := &err
	if !c.broken.CompareAndSwap(nil, p) {
		return false
	}
	if own != nil {
		c.ownCause = own
		c.ownAbort.Store(p)
	}
	c.log.Warn("collective: broken", "rank", c.rank, "err", err)
	c.markBroke()
	c.box.fail(err)
	if own != nil {
		close(c.abandoned)
	}
	return true
}

// untilBroken returns ctx, ended too (its cause the communicator's error)
// once the communicator breaks, and the function that lets it go. An
// operation whose waits do not watch the communicator (an rpc call to a
// peer, which may be a new communicator on the same address waiting for
// this rank to join it) ends with it so.
func (c *Comm) untilBroken(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.broke, func() { cancel(c.err()) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// err returns why the communicator cannot start an operation, or nil.
func (c *Comm) err() error {
	if c.closed.Load() {
		return errorf(ErrClosed, "rank %d", c.rank)
	}
	if p := c.broken.Load(); p != nil {
		if o := c.ownAbort.Load(); o == p {
			return &brokenError{cause: c.ownCause}
		}
		return &brokenError{cause: *p}
	}
	return nil
}

// cause returns why the communicator broke, or nil: the error of the
// operations in flight when it did.
func (c *Comm) cause() error {
	if p := c.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// brokenError is the error of an operation started on a broken
// communicator: it matches ErrBroken and its cause.
type brokenError struct{ cause error }

func (e *brokenError) Error() string {
	return "rpc: " + rpc.FailedPrecondition.String() + ": " + ErrBroken.Error() + ": " + rpcMsg(e.cause)
}

func (e *brokenError) Unwrap() []error {
	return []error{&rpc.Error{Code: rpc.FailedPrecondition, Reason: "collective.broken", Msg: ErrBroken.Error()}, ErrBroken, e.cause}
}

// Close leaves the communicator: the other ranks' pending and later
// operations fail with ErrPeerLost. It releases the shared mappings and
// connections; calls in flight on this rank fail with ErrClosed. Close is
// idempotent.
func (c *Comm) Close() error {
	if c.closed.Load() {
		return nil
	}
	if (c.shm != nil || c.hier != nil) && c.cause() == nil && c.inflight.Load() < 0 {
		// The others may still read what this rank published for the
		// last collective: wait (a while) until they are done with it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if c.shm != nil {
			c.shm.waitAll(ctx, uint32(3*c.completed.Load()))
		} else {
			c.hier.waitDone(ctx)
		}
		cancel()
	}
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(c.closing)
	c.fail(errorf(ErrClosed, "rank %d", c.rank))
	// Let the watch handlers tell the others how far this rank got, before
	// the connections close (bounded: a peer may be gone).
	for deadline := time.Now().Add(2 * time.Second); c.watchers.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the responses on their way
	c.shutdown()
	return nil
}

func (c *Comm) shutdown() {
	c.stopW()
	// Let the watch handlers answer "closed" before the server goes.
	if c.srv != nil {
		time.Sleep(0)
	}
	c.opMu.Lock() // wait for a collective in flight to see the failure
	// The p2p files go first: the last rank out removes the folder when
	// only its marker is left.
	c.inboxes.close()
	c.p2pOut.close()
	c.p2pIn.close()
	if c.shm != nil {
		c.shm.close()
	}
	c.hier.close()
	c.opMu.Unlock()
	c.cmu.Lock()
	for _, cl := range c.clients {
		if cl != nil {
			cl.Close()
		}
	}
	c.cmu.Unlock()
	if c.srv != nil {
		c.srv.Close()
	}
	c.wg.Wait()
}

// listenRetry listens on addr, retrying for up to 5 s (and no longer than
// ctx lets it) while the address is in use: the port of a communicator
// just closed may take a moment to be free again.
// listenTCP is net.Listen; a test makes it pick the port the kernel could.
var listenTCP = net.Listen

// listenBeside listens on addr for a rank other than 0. Where addr's port
// is 0, the kernel may pick the rendezvous port itself while rank 0 has
// not bound it yet (a rank started first, or rank 0's port just freed):
// this rank would then dial its own server for the rendezvous and fail,
// and a rank after it would reach this one instead of rank 0. So a
// listener on the rendezvous port is kept only until another is open,
// then closed, leaving the port to rank 0.
func listenBeside(addr, rendezvous string) (net.Listener, error) {
	_, rport, _ := net.SplitHostPort(rendezvous)
	if _, port, _ := net.SplitHostPort(addr); port != "0" {
		return listenTCP("tcp", addr) // a port of its own choosing
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 8 {
		l, err := listenTCP("tcp", addr)
		if err != nil {
			return nil, err
		}
		if _, port, _ := net.SplitHostPort(l.Addr().String()); port != rport {
			return l, nil
		}
		held = append(held, l)
	}
	return nil, fmt.Errorf("every port the kernel offered was the rendezvous port %s", rport)
}

func listenRetry(ctx context.Context, addr string) (net.Listener, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%v)", err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
