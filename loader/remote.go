package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A loader whose producer is another process (docs/loader.md, "A producer
// in another process"): the node keeps the ring, the consumers, their acks,
// heartbeats, epochs and drops, as for a dataset's producer, and a process
// that iterates a PyTorch DataLoader (python/tensorwire/producer.py)
// attaches with a loader.produce stream and fills the ring's slots the node
// grants it, one batch at a time.

// MethodProduce is the message stream a producer process attaches with:
// the node grants slots, the process fills them and says so.
const MethodProduce = "loader.produce"

// ProducerRemote is Config.Producer for a loader whose batches come from a
// producer process.
const ProducerRemote = "remote"

// Layouts of a remote producer's batches (produceRequest.Layout): how its
// tensors' keys make the batch. A dict's keys are its own (nested dicts
// as key paths); a tuple's or list's are their positions, "0", "1"...; a
// lone tensor's is "0".
const (
	LayoutDict   = "dict"
	LayoutTuple  = "tuple"
	LayoutList   = "list"
	LayoutTensor = "tensor"
)

// The messages of loader.produce. Field names on the wire are the codec
// tags.
type (
	produceRequest struct {
		Name    string               `codec:"name"`
		Schema  tensordict.RowSchema `codec:"schema"`  // of a row, learnt from the first batch
		Layout  string               `codec:"layout"`  // the batches' structure (LayoutDict...)
		Samples int                  `codec:"samples"` // rows per epoch
		Batch   int                  `codec:"batch"`   // rows per batch; an epoch's last has the rest
		Bytes   bool                 `codec:"bytes"`   // the rows come with the messages, not through the mapping
	}
	// produceMessage is the node's: attached first, then a grant per
	// batch, in the order of the batches.
	produceMessage struct {
		Attached *attachment `codec:"attached"`
		Grant    *grant      `codec:"grant"`
	}
	// attachment tells the process where the ring is.
	attachment struct {
		Ring   string `codec:"ring"`   // the ring's id
		Prefix string `codec:"prefix"` // the ring's folder, relative to the node's root; "" when not under it
		Slots  int    `codec:"slots"`
		Epoch  int64  `codec:"epoch"` // the first epoch it will be granted batches of
	}
	// grant is the node's leave to write batch Index of Epoch (Count
	// batches) into slot Slot, Rows rows; the process's published message
	// gives it back once written.
	grant struct {
		Epoch int64 `codec:"epoch"`
		Index int   `codec:"index"`
		Count int   `codec:"count"`
		Slot  int   `codec:"slot"`
		Rows  int   `codec:"rows"`
	}
	// publishedMessage is the process's: the grant it filled (its rows in
	// Rows by bytes), or Error, its data loader's failure, which reaches
	// the consumers.
	publishedMessage struct {
		Published *grant  `codec:"published"`
		Rows      *rpc.TD `codec:"rows"`
		Error     string  `codec:"error"`
	}
)

// remotes is a Service's loaders whose producer is a process, by name.
type remotes struct {
	mu sync.Mutex
	m  map[string]*Remote
}

func (rs *remotes) get(name string) *Remote {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.m[name]
}

// Remote is a loader served by a node whose producer is another process
// that attaches to it (MethodProduce): until one does, and after it goes
// away, consumers' joins fail with ErrNoProducer, which they wait out.
// Each process that attaches gets a ring of its own (and consumers of the
// one before are dropped); it begins at the epoch after the last one
// begun in the folder.
type Remote struct {
	svc  *Service
	name string
	cfg  Config // defaults applied; Batch is the attached process's

	mu       sync.Mutex
	cur      *Producer // attached; nil when none
	closed   bool
	lastRing string // the ring of the last process detached, and its failure, if it failed:
	lastErr  error  // a consumer of that ring whose stream opens after the detach is told it
}

// unattached says why no process of r is attached, to a consume stream of
// ring (a join: ""): the last process's failure itself if ring was its
// ring (the consumer took part in it); else ErrNoProducer, waited out for
// the next process, naming that failure if there was one.
func (r *Remote) unattached(ring string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.lastErr != nil && ring != "" && ring == r.lastRing:
		return r.lastErr
	case r.lastErr != nil:
		return wrapf(ErrNoProducer, "no producer process is attached to loader %q (the last one failed: %v)", r.name, r.lastErr)
	}
	return wrapf(ErrNoProducer, "no producer process is attached to loader %q", r.name)
}

// AddRemote serves a loader named name whose batches come from a producer
// process, with its ring in cfg.Dir (cfg.Producer must be ProducerRemote;
// Batch is the process's). ErrConfig for a bad cfg, ErrExists for a name
// already served.
func (svc *Service) AddRemote(name string, cfg Config) (*Remote, error) {
	if cfg.Producer != ProducerRemote {
		return nil, wrapf(ErrConfig, "a remote loader's Producer is %q, not %q", ProducerRemote, cfg.Producer)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, wrapf(ErrConfig, "a loader needs a name")
	}
	r := &Remote{svc: svc, name: name, cfg: cfg.WithDefaults()}
	svc.remotes.mu.Lock()
	defer svc.remotes.mu.Unlock()
	if _, err := svc.producers.Lookup(name); err == nil || svc.remotes.m[name] != nil {
		return nil, wrapf(ErrExists, "a loader named %q is already served", name)
	}
	if svc.remotes.m == nil {
		svc.remotes.m = map[string]*Remote{}
	}
	svc.remotes.m[name] = r
	return r, nil
}

// Producer returns the attached process's producer, nil when none is.
func (r *Remote) Producer() *Producer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Close stops serving the loader: an attached process is detached (its
// stream ends with ErrClosed), its ring removed.
func (r *Remote) Close() error {
	r.svc.remotes.mu.Lock()
	if r.svc.remotes.m[r.name] == r {
		delete(r.svc.remotes.m, r.name)
	}
	r.svc.remotes.mu.Unlock()
	r.mu.Lock()
	r.closed = true
	p := r.cur
	r.mu.Unlock()
	if p != nil {
		why := wrapf(ErrClosed, "loader %q is no longer served", r.name)
		p.feed.cut(why) // the process's stream ends with why, not when the process gives up
		return r.detach(p, why, false)
	}
	return nil
}

// checkProduce checks a producer process's request against the ring the
// node would make for it: a ring of at most 2^31 rows, and samples whose
// batches every consumer can count (no more than math.MaxInt less the
// ring's rows, the largest consumer batch, as checkJoin wants). Samples
// near math.MaxInt were taken: the count of batches overflowed to a
// negative number, and the node ran through empty epochs.
func (r *Remote) checkProduce(req produceRequest) error {
	switch {
	case len(req.Schema) == 0:
		return wrapf(ErrArgument, "a batch of no tensors")
	case req.Batch < 1 || req.Samples < 1:
		return wrapf(ErrArgument, "batch size %d, %d samples: want at least 1 of each", req.Batch, req.Samples)
	case int64(req.Batch)*int64(r.cfg.Slots) > 1<<31:
		return wrapf(ErrArgument, "a ring of %d slots of %d rows", r.cfg.Slots, req.Batch)
	case req.Samples > math.MaxInt-req.Batch*r.cfg.Slots:
		return wrapf(ErrArgument, "%d samples: want at most %d for a ring of %d slots of %d rows",
			req.Samples, math.MaxInt-req.Batch*r.cfg.Slots, r.cfg.Slots, req.Batch)
	case req.Layout != LayoutDict && req.Layout != LayoutTuple && req.Layout != LayoutList && req.Layout != LayoutTensor:
		return wrapf(ErrArgument, "layout %q: want dict, tuple, list or tensor", req.Layout)
	}
	if err := req.Schema.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrArgument, err)
	}
	return nil
}

// produce serves a producer process's stream: it makes a ring for the
// process's batches, serves it under the loader's name, grants the
// process slots as the consumers free them, and takes back the batches it
// publishes, until the process ends the stream or goes away; then the
// ring's consumers are told ErrNoProducer (or the process's error) and
// the ring is removed.
func (svc *Service) produce(ctx context.Context, req produceRequest, st *rpc.ServerStream[publishedMessage, produceMessage]) error {
	r := svc.remotes.get(req.Name)
	if r == nil {
		if _, err := svc.producers.Lookup(req.Name); err == nil {
			return wrapf(ErrExists, "loader %q reads a dataset: it takes no producer process", req.Name)
		}
		return wrapf(ErrNotFound, "no remote loader %q (the node's --loader %s,producer=remote)", req.Name, req.Name)
	}
	if !req.Bytes {
		if err := rpc.RequireCoherent(ctx, "writing the ring"); err != nil {
			return err
		}
	}
	if err := r.checkProduce(req); err != nil {
		return err
	}
	f := &feed{pub: make(chan error, 1), done: make(chan struct{})}
	p, err := r.attach(req, f)
	if err != nil {
		return err
	}
	// By bytes, each batch's rows are written into their slot (take)
	// before the next message is received: their memory serves the next.
	st.ReuseBuffers()
	// Grants are sent under the stream's own context, not the producer's:
	// detach closes the producer, and a Send that a cancelled context cuts
	// short resets the stream, so that the process would get "the node
	// reset the stream" instead of the status the handler ends it with
	// (the key its batch got wrong, say). detach waits for a grant under
	// way (endGrants) before it closes the producer.
	sctx, cancelSend := context.WithCancel(ctx)
	defer cancelSend()
	// A process that fills no slot within GrantWait is detached (fill):
	// its messages' wait ends then.
	rctx, cancelRecv := context.WithCancel(ctx)
	defer cancelRecv()
	f.mu.Lock()
	f.send = func(ctx context.Context, g grant) error { return st.Send(ctx, produceMessage{Grant: &g}) }
	f.sendCtx, f.cancelSend, f.cancelRecv = sctx, cancelSend, cancelRecv
	if f.cutBy != nil { // cut (Remote.Close) before it could cancel this
		cancelRecv()
	}
	f.mu.Unlock()
	why := wrapf(ErrNoProducer, "the producer process of loader %q went away", req.Name)
	done := false // the process ended its side: it is done, and its consumers may finish what it published
	defer func() {
		if done {
			why = wrapf(ErrNoProducer, "the producer process of loader %q is done (it produced what it was asked)", req.Name)
		}
		r.detach(p, why, done)
	}()
	sp, err := svc.producers.Lookup(req.Name)
	if err != nil || sp.Item != p {
		return wrapf(ErrClosed, "loader %q is no longer served", req.Name)
	}
	if err := st.Send(ctx, produceMessage{Attached: &attachment{Ring: p.ring.id, Prefix: sp.Rel, Slots: p.cfg.Slots, Epoch: p.epoch + 1}}); err != nil {
		return err
	}
	close(f.ready)
	for {
		m, err := st.Recv(rctx)
		if err != nil {
			// A fill past its deadline, or Remote.Close, cancels the
			// receive (cut): its error, not the cancellation, says why.
			if cut := f.cutErr(); cut != nil {
				why = cut
				return cut
			}
		}
		if errors.Is(err, io.EOF) {
			done = true
			return nil
		}
		if err != nil {
			return err
		}
		if m.Error != "" {
			p.failWith(fmt.Errorf("%w: the producer process: %s", ErrFailed, m.Error))
			return nil
		}
		if err := f.take(p, m); err != nil {
			why = wrapf(ErrNoProducer, "the producer process of loader %q was refused: %v", req.Name, err)
			return err
		}
	}
}

// attach makes the producer of a process's request and serves it.
func (r *Remote) attach(req produceRequest, f *feed) (*Producer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, wrapf(ErrClosed, "loader %q is no longer served", r.name)
	}
	if r.cur != nil {
		return nil, wrapf(ErrInUse, "another producer process is attached to loader %q", r.name)
	}
	cfg := r.cfg
	cfg.Batch = req.Batch
	if cfg.Window > cfg.Slots {
		cfg.Window = cfg.Slots
	}
	f.ready, f.grantWait = make(chan struct{}), cfg.GrantWait
	rg, err := openRing(cfg, req.Schema)
	if err != nil {
		return nil, err
	}
	p := &Producer{
		cfg: cfg, feed: f, schema: req.Schema.Clone(), layout: req.Layout, ring: rg, n: req.Samples,
		nb:      (req.Samples + req.Batch - 1) / req.Batch,
		changed: make(chan struct{}), members: map[uint64]*member{},
		epoch: rg.meta.Epoch, slot: make([]slotInfo, cfg.Slots), epochs: map[int64]epochInfo{},
		done: make(chan struct{}),
	}
	f.schema, f.ring = p.schema, rg
	if _, replaced := r.svc.producers.Replace(r.name, p); replaced {
		// Cannot be: r.cur was nil, and only r serves its name.
		r.svc.producers.Remove(r.name)
		rg.close(true)
		return nil, wrapf(ErrExists, "a loader named %q is already served", r.name)
	}
	pctx, stop := context.WithCancel(context.Background())
	p.stop = stop
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		select { // grants wait for the attachment to be sent
		case <-f.ready:
			p.run(pctx)
		case <-f.done:
		case <-pctx.Done():
		}
	}()
	go func() { defer wg.Done(); p.reap(pctx) }()
	go func() { wg.Wait(); close(p.done) }()
	r.cur = p
	r.cfg.Log.Info("loader: a producer process attached", "name", r.name, "ring", rg.id, "samples", req.Samples,
		"batch", req.Batch, "layout", req.Layout, "bytes", req.Bytes, "epoch", rg.meta.Epoch+1)
	return p, nil
}

// detach ends p, the producer of a process that went away (why): no more
// slots are granted; with drain (the process ended its stream: it is done)
// the consumers may first finish the batches it published, for up to
// MaxWait; then their streams end with why (or the process's own error),
// p stops being served, and its ring is removed once no stream reads it.
func (r *Remote) detach(p *Producer, why error, drain bool) error {
	p.feed.stop(why)
	p.feed.endGrants(p.cfg.Heartbeat)
	p.mu.Lock()
	deadline := time.Now().Add(p.cfg.MaxWait)
	for drain && p.err == nil && time.Now().Before(deadline) && (p.unpublishedLocked() || p.heldLocked()) {
		p.waitLocked(context.Background(), time.Until(deadline))
	}
	if p.gone == nil {
		p.gone = why
	}
	p.broadcastLocked()
	// The consume streams waiting for a batch end by themselves, with why
	// or the process's error; those stuck sending to a slow consumer are
	// cancelled after a heartbeat period.
	deadline = time.Now().Add(p.cfg.Heartbeat)
	for p.active > 0 && time.Now().Before(deadline) {
		p.waitLocked(context.Background(), time.Until(deadline))
	}
	p.mu.Unlock()
	p.feed.cancelStreams()
	p.mu.Lock()
	for p.active > 0 {
		p.waitLocked(context.Background(), 100*time.Millisecond)
	}
	failed := p.err
	p.mu.Unlock()
	// The failure is recorded before p stops being served: a consumer of
	// p's ring whose stream opens in between is told it, not ErrNoProducer
	// (which it would wait out for the next process).
	r.mu.Lock()
	r.lastRing, r.lastErr = p.ring.id, failed
	r.mu.Unlock()
	if sp, err := r.svc.producers.Lookup(r.name); err == nil && sp.Item == p {
		r.svc.producers.Remove(r.name)
	}
	if testHookDetached != nil {
		testHookDetached(p)
	}
	err := p.Close()
	r.mu.Lock()
	if r.cur == p {
		r.cur = nil
	}
	r.mu.Unlock()
	st := p.Stats()
	r.cfg.Log.Info("loader: the producer process detached", "name", r.name, "why", why, "published", st.Published, "epochs", st.Epochs)
	return err
}

// Test hooks, nil outside tests: testHookDetached runs in detach once p
// stops being served, before it is closed; testHookGrant runs before a
// grant is sent to the process, with the context it is sent under.
var (
	testHookDetached func(p *Producer)
	testHookGrant    func(ctx context.Context, g grant)
)

// unpublishedLocked reports whether the process has filled a batch that p
// has not published yet: its published message was taken (the process may
// have ended its stream just after it), and p's run publishes it next.
// Until then no consumer holds it, and heldLocked cannot see it.
func (p *Producer) unpublishedLocked() bool {
	p.feed.mu.Lock()
	defer p.feed.mu.Unlock()
	return p.st.Published < p.feed.taken
}

// heldLocked reports whether a consumer still needs a batch in the ring.
func (p *Producer) heldLocked() bool {
	for _, s := range p.slot {
		if len(p.holdersLocked(s)) > 0 {
			return true
		}
	}
	return false
}

// failWith stops p on err (ErrFailed: the process's data loader raised):
// the consumers' streams end with it.
func (p *Producer) failWith(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
		p.cfg.Log.Error("loader: the producer failed and stopped serving", "dir", p.cfg.Dir, "err", err)
	}
	p.broadcastLocked()
}

// track counts a consume stream of p, whose end cancel brings about when
// p's process detaches; ErrNoProducer if it has.
func (p *Producer) track(cancel context.CancelFunc) error {
	if p.feed == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.goneLocked(); err != nil {
		return err
	}
	p.active++
	p.feed.mu.Lock()
	p.feed.cancels = append(p.feed.cancels, cancel)
	p.feed.mu.Unlock()
	return nil
}

// untrack counts a consume stream of p ended.
func (p *Producer) untrack() {
	if p.feed == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active--
	p.broadcastLocked()
}

// goneErr returns why p's process detached: its own error if it failed,
// else ErrNoProducer; nil while it is attached (and for a dataset's
// producer).
func (p *Producer) goneErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.goneLocked()
}

func (p *Producer) goneLocked() error {
	if p.gone == nil {
		return nil
	}
	if p.err != nil {
		return p.err
	}
	return p.gone
}

// feed is a producer's link to its process: fill grants a slot and waits
// for the process to publish it; the stream's handler takes the
// process's messages (take).
type feed struct {
	schema  tensordict.RowSchema
	ring    *ring
	ready   chan struct{}  // closed once the attachment is sent
	pub     chan error     // the outstanding grant's outcome
	sending sync.WaitGroup // the grant being sent, if one is (endGrants waits for it)
	// grantWait bounds the wait for the process to publish a grant:
	// Config.GrantWait.
	grantWait time.Duration

	mu          sync.Mutex
	send        func(context.Context, grant) error // sends a grant on the process's stream
	sendCtx     context.Context                    // the grants' sends', the stream's own
	cancelSend  func()                             // cuts a send short (endGrants)
	cancelRecv  func()                             // ends the handler's wait for the process's messages
	cutBy       error                              // why the handler's wait was ended (cut): no slot filled in grantWait, the loader closed
	outstanding *grant                             // granted, not yet published
	taken       uint64                             // published messages taken: batches filled
	done        chan struct{}
	why         error // set before done is closed
	cancels     []context.CancelFunc
}

// fill grants the process g and waits until it has published it.
func (f *feed) fill(ctx context.Context, g grant) error {
	f.mu.Lock()
	if f.why != nil {
		f.mu.Unlock()
		return f.why
	}
	f.outstanding = &g
	f.sending.Add(1) // under f.mu, before stop: endGrants waits for it
	send, sctx := f.send, f.sendCtx
	f.mu.Unlock()
	if testHookGrant != nil {
		testHookGrant(sctx, g)
	}
	err := send(sctx, g)
	f.sending.Done()
	if err != nil {
		return fmt.Errorf("%w: granting slot %d: %w", ErrNoProducer, g.Slot, err)
	}
	timer := time.NewTimer(f.grantWait)
	defer timer.Stop()
	select {
	case err := <-f.pub:
		return err
	case <-timer.C:
		select {
		case err := <-f.pub: // published just in time
			return err
		default:
		}
		err := wrapf(ErrNoProducer, "the producer process filled no slot for %v (batch %d of epoch %d was granted): "+
			"it was detached", f.grantWait, g.Index, g.Epoch)
		f.cut(err)
		return err
	case <-f.done:
		select {
		case err := <-f.pub: // published before the process ended its side
			return err
		default:
			return f.why
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take applies a published message of the process to p: it checks it
// answers the outstanding grant and, by bytes, writes its rows into the
// slot. An error is the process's (the batch is not the schema's, say):
// it ends the stream.
func (f *feed) take(p *Producer, m publishedMessage) error {
	f.mu.Lock()
	g := f.outstanding
	f.outstanding = nil
	f.mu.Unlock()
	switch {
	case m.Published == nil:
		return wrapf(ErrArgument, "a message with neither a published batch nor an error")
	case g == nil:
		return wrapf(ErrArgument, "batch %d of epoch %d published without a grant", m.Published.Index, m.Published.Epoch)
	case *m.Published != *g:
		return wrapf(ErrArgument, "published %+v, granted %+v", *m.Published, *g)
	}
	if m.Rows != nil && m.Rows.TensorDict != nil {
		dst, err := f.ring.slotView(g.Slot, g.Rows)
		if err != nil {
			return err
		}
		if err := copyBatch(dst, f.schema, m.Rows.TensorDict, g.Rows); err != nil {
			return err
		}
	}
	f.mu.Lock()
	f.taken++
	f.mu.Unlock()
	f.pub <- nil
	return nil
}

// cut ends the stream's handler's wait for the process's next message:
// the handler ends the stream with why (the first cut's, if cut twice).
// Before the handler set its receive up, the cut is kept and the handler
// ends the stream as soon as it has.
func (f *feed) cut(why error) {
	f.mu.Lock()
	if f.cutBy == nil {
		f.cutBy = why
	}
	cancel := f.cancelRecv
	f.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// cutErr returns why the handler's wait was cut (cut), or nil.
func (f *feed) cutErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cutBy
}

// stop makes fill return why from now on: no more grants.
func (f *feed) stop(why error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.why == nil {
		f.why = why
		close(f.done)
	}
}

// endGrants waits, after stop, for a grant being sent to be sent whole,
// for at most d (a process that does not read its stream holds nobody up
// for longer); then it cuts the send short.
func (f *feed) endGrants(d time.Duration) {
	sent := make(chan struct{})
	go func() { f.sending.Wait(); close(sent) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-sent:
	case <-t.C:
		f.mu.Lock()
		cancel := f.cancelSend
		f.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		<-sent
	}
}

// stopped reports whether stop was called.
func (f *feed) stopped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.why != nil
}

// cancelStreams ends the consume streams of the feed's producer.
func (f *feed) cancelStreams() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.cancels {
		c()
	}
}

// copyBatch copies src, a batch of rows rows sent by a producer process,
// into dst, checking it has schema's tensors, and only those: an error
// (ErrArgument) names the key that differs.
func copyBatch(dst *tensordict.TensorDict, schema tensordict.RowSchema, src *tensordict.TensorDict, rows int) error {
	n := 0
	for path := range src.Leaves() {
		n++
		if !slices.ContainsFunc(schema, func(f tensordict.RowField) bool { return slices.Equal(f.Key, path) }) {
			return wrapf(ErrArgument, "the batch has %s, which its first batch had not", strings.Join(path, "/"))
		}
	}
	for _, f := range schema {
		key := strings.Join(f.Key, "/")
		t, err := src.Tensor(f.Key...)
		if err != nil {
			return wrapf(ErrArgument, "the batch has no %s", key)
		}
		want := append([]int{rows}, f.Shape...)
		if t.DType() != f.DType || !slices.Equal(t.Shape(), want) {
			return wrapf(ErrArgument, "%s is %v %v, want %v %v", key, t.DType(), t.Shape(), f.DType, want)
		}
		d, err := dst.Tensor(f.Key...)
		if err != nil {
			return err
		}
		if err := d.SetSlice(0, t); err != nil {
			return err
		}
	}
	return nil
}
