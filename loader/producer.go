package loader

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/slots"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Producer reads a dataset's samples, transforms them once, and writes
// them batch by batch into a ring of slots that its consumers read, epoch
// after epoch. Serve it to other processes with Register and Service.Add;
// consumers Dial it.
//
// It produces an epoch only for consumers: it waits for the first to join,
// then publishes the epoch's batches in order, each into the next ring slot
// once every live consumer has released the batch that slot held (waiting
// at most Config.MaxWait for the slowest, then dropping it). An epoch every
// consumer has left is cut short. Consumers that stay take part in the
// next epoch, which begins at once.
//
// A Producer is safe for concurrent use. Close it when done.
type Producer struct {
	cfg    Config
	pipe   *pipeline // nil for a remote producer's (feed)
	feed   *feed     // a producer process's batches (remote.go); nil for a dataset's
	schema tensordict.RowSchema
	layout string // the batches' structure, for a remote producer's (remote.go)
	ring   *ring
	n      int // samples per epoch
	nb     int // batches per epoch

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced when anything below changes
	members   map[uint64]*member
	closed    bool
	err       error // set when the producer failed (ErrFailed)
	gone      error // set when a remote producer's process detached (ErrNoProducer)
	active    int   // consume streams being served (a remote producer waits for them before unmapping)
	epoch     int64 // the current epoch, or the last one if !running (-1: none yet)
	running   bool
	window    bool // the current epoch's window is open: joiners take part in it
	seq       uint64
	slot      []slotInfo          // what each slot holds
	epochs    map[int64]epochInfo // epochs with batches that may still be in the ring
	st        Stats
	waitStart time.Time // when the producer began waiting for a slot; zero when it is not

	stop context.CancelFunc
	done chan struct{} // closed when run and reap have returned

	copies batchCopies // the batches copied out of the ring for consumers by bytes
}

// slotInfo is what a slot holds: a published batch when valid.
type slotInfo struct {
	valid bool
	seq   uint64
	epoch int64
	index int
	rows  int
	word  uint64
}

// epochInfo places an epoch's batches in the sequence.
type epochInfo struct {
	first uint64 // the seq of its batch 0
	count int    // its batches; fewer than an epoch's when it was cut short
	ended bool   // all count batches are published
}

// member is a consumer, as the producer counts it.
type member struct {
	id       uint64
	epoch    int64  // it takes part in this epoch and the ones after
	released uint64 // it is done with every batch of seq < released of its epochs
	seen     time.Time
}

// holds reports whether m still needs the batch s.
func (m *member) holds(s slotInfo) bool {
	return s.valid && s.epoch >= m.epoch && s.seq >= m.released
}

// Stats is a snapshot of a producer.
type Stats struct {
	Consumers   int    `codec:"consumers" json:"consumers"`       // live consumers
	Joined      uint64 `codec:"joined" json:"joined"`             // consumers that ever joined
	Dropped     uint64 `codec:"dropped" json:"dropped"`           // of those, dropped: silent too long
	DroppedSlow uint64 `codec:"dropped_slow" json:"dropped_slow"` // dropped: held a slot past MaxWait
	Left        uint64 `codec:"left" json:"left"`                 // left (Close)
	Epoch       int64  `codec:"epoch" json:"epoch"`               // the current or last epoch; -1 before the first
	Running     bool   `codec:"running" json:"running"`           // an epoch is being produced
	Window      bool   `codec:"window" json:"window"`             // joiners now take part in the current epoch
	Published   uint64 `codec:"published" json:"published"`       // batches published, all epochs
	InEpoch     int    `codec:"in_epoch" json:"in_epoch"`         // of the current epoch
	Epochs      uint64 `codec:"epochs" json:"epochs"`             // epochs completed
	CutShort    uint64 `codec:"cut_short" json:"cut_short"`       // epochs cut short: every consumer left
	WaitNS      int64  `codec:"wait_ns" json:"wait_ns"`           // time spent waiting for slots to be released
	Samples     int    `codec:"samples" json:"samples"`           // per epoch
	Batch       int    `codec:"batch" json:"batch"`               // rows per producer batch
	Slots       int    `codec:"slots" json:"slots"`
	Failed      string `codec:"failed" json:"failed,omitempty"` // why the producer stopped, if it failed
}

// NewProducer opens cfg.Dataset, makes the ring in cfg.Dir and starts
// producing as soon as a consumer joins. ErrConfig for a bad Config,
// ErrDataset for a dataset it cannot serve (missing, not a TensorDict, no
// rows, refused by the transform), ErrInUse when another producer holds
// the folder, ErrExists when the folder holds something else. On error
// nothing is left running and nothing but the folder (and its MetaFile and
// LockFile) is left on disk.
func NewProducer(cfg Config) (*Producer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Producer == ProducerRemote {
		return nil, wrapf(ErrConfig, "producer=remote: its producer is a process (Service.AddRemote)")
	}
	cfg = cfg.WithDefaults()
	pipe, err := newPipeline(cfg, cfg.Batch)
	if err != nil {
		return nil, err
	}
	r, err := openRing(cfg, pipe.schema)
	if err != nil {
		pipe.close()
		return nil, err
	}
	p := &Producer{
		cfg: cfg, pipe: pipe, schema: pipe.schema, ring: r, n: pipe.len(), nb: (pipe.len() + cfg.Batch - 1) / cfg.Batch,
		changed: make(chan struct{}), members: map[uint64]*member{},
		epoch: r.meta.Epoch, slot: make([]slotInfo, cfg.Slots), epochs: map[int64]epochInfo{},
		done: make(chan struct{}),
	}
	ctx, stop := context.WithCancel(context.Background())
	p.stop = stop
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.run(ctx) }()
	go func() { defer wg.Done(); p.reap(ctx) }()
	go func() { wg.Wait(); close(p.done) }()
	return p, nil
}

// Config returns the producer's configuration, defaults applied.
func (p *Producer) Config() Config { return p.cfg }

// Schema returns the schema of the batches' rows.
func (p *Producer) Schema() tensordict.RowSchema { return p.schema.Clone() }

// Len returns the number of samples in an epoch.
func (p *Producer) Len() int { return p.n }

// Stats returns a snapshot of the producer.
func (p *Producer) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.st
	st.Consumers = len(p.members)
	st.Epoch, st.Running, st.Window = p.epoch, p.running, p.window
	if e, ok := p.epochs[p.epoch]; ok && p.running {
		st.InEpoch = int(p.seq - e.first)
	}
	if !p.waitStart.IsZero() {
		st.WaitNS += int64(time.Since(p.waitStart))
	}
	st.Samples, st.Batch, st.Slots = p.n, p.cfg.Batch, p.cfg.Slots
	if p.err != nil {
		st.Failed = p.err.Error()
	}
	return st
}

// broadcastLocked wakes everyone waiting for a change; p.mu is held.
func (p *Producer) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// waitLocked releases p.mu until something changes, ctx ends or d passes
// (d <= 0: no limit), and takes it again. It returns ctx's error if ctx
// ended.
func (p *Producer) waitLocked(ctx context.Context, d time.Duration) error {
	ch := p.changed
	p.mu.Unlock()
	defer p.mu.Lock()
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ch:
	case <-timeout:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// participantLocked reports whether some consumer takes part in epoch e.
func (p *Producer) participantLocked(e int64) bool {
	for _, m := range p.members {
		if m.epoch <= e {
			return true
		}
	}
	return false
}

// run produces epochs until ctx ends or it fails.
func (p *Producer) run(ctx context.Context) {
	for {
		e, ok := p.beginEpoch(ctx)
		if !ok {
			return
		}
		if err := p.produceEpoch(ctx, e); err != nil {
			if ctx.Err() == nil && !errors.Is(err, ErrNoProducer) && (p.feed == nil || !p.feed.stopped()) {
				if errors.Is(err, memmap.ErrFault) && p.pipe != nil {
					err = fmt.Errorf("%w%s", err, truncatedFiles(p.pipe.src.td, p.ring.store))
				}
				p.mu.Lock()
				p.err = fmt.Errorf("%w: epoch %d: %w", ErrFailed, e, err)
				// Logged before anyone is told: a consumer that sees the
				// failure finds it in the log.
				p.cfg.Log.Error("loader: the producer failed and stopped serving", "dir", p.cfg.Dir, "err", p.err)
				p.broadcastLocked()
				p.mu.Unlock()
			}
			return
		}
	}
}

// beginEpoch waits for a consumer to take part in the next epoch and
// begins it.
func (p *Producer) beginEpoch(ctx context.Context) (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.epoch + 1
	for !p.participantLocked(e) {
		if p.waitLocked(ctx, 0) != nil {
			return 0, false
		}
	}
	// MetaFile first: a producer made again for the folder begins after
	// the last epoch any consumer may have seen a batch of.
	p.ring.meta.Epoch = e
	if err := p.ring.writeMeta(); err != nil {
		p.err = fmt.Errorf("%w: epoch %d: %w", ErrFailed, e, err)
		p.cfg.Log.Error("loader: the producer failed and stopped serving", "dir", p.cfg.Dir, "err", p.err)
		p.broadcastLocked()
		return 0, false
	}
	p.epoch, p.running, p.window = e, true, p.cfg.Window > 0
	p.epochs[e] = epochInfo{first: p.seq, count: p.nb}
	p.pruneLocked()
	p.broadcastLocked()
	return e, true
}

// pruneLocked forgets epochs none of whose batches can still be in the
// ring.
func (p *Producer) pruneLocked() {
	for e, info := range p.epochs {
		if info.ended && info.first+uint64(info.count)+uint64(p.cfg.Slots) <= p.seq {
			delete(p.epochs, e)
		}
	}
}

// produceEpoch publishes the batches of epoch e, or fewer if every
// consumer leaves it.
func (p *Producer) produceEpoch(ctx context.Context, e int64) error {
	var order []int
	if p.pipe != nil {
		order = p.pipe.order(e)
	}
	for k := range p.nb {
		s, gen, ok, err := p.takeSlot(ctx, e, k)
		if err != nil || !ok {
			return err
		}
		first := k * p.cfg.Batch
		rows := min(p.cfg.Batch, p.n-first)
		dst, err := p.ring.slotView(s, rows)
		if err == nil {
			if p.feed != nil {
				err = p.feed.fill(ctx, grant{Epoch: e, Index: k, Count: p.nb, Slot: s, Rows: rows})
			} else {
				err = p.pipe.fill(dst, e, first, order[first:first+rows])
			}
		}
		if err != nil {
			return err
		}
		p.publish(s, gen, e, k, rows)
	}
	p.mu.Lock()
	info := p.epochs[e]
	info.ended = true
	p.epochs[e] = info
	p.running, p.window = false, false
	p.st.Epochs++
	p.broadcastLocked()
	p.mu.Unlock()
	return nil
}

// takeSlot waits until the slot for batch k of epoch e is free (bounded
// by MaxWait, after which the consumers holding it are dropped) and marks
// it being written. ok is false when every consumer has left the epoch,
// which then ends.
func (p *Producer) takeSlot(ctx context.Context, e int64, k int) (slot int, gen uint64, ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := int(p.seq % uint64(p.cfg.Slots))
	deadline := time.Now().Add(p.cfg.MaxWait)
	for {
		if !p.participantLocked(e) {
			p.cutShortLocked(e, k)
			return 0, 0, false, nil
		}
		holders := p.holdersLocked(p.slot[s])
		if len(holders) == 0 {
			break
		}
		now := time.Now()
		if !now.Before(deadline) {
			for _, m := range holders {
				delete(p.members, m.id)
				p.st.DroppedSlow++
			}
			p.broadcastLocked()
			continue
		}
		if p.waitStart.IsZero() {
			p.waitStart = now
		}
		err := p.waitLocked(ctx, deadline.Sub(now))
		if err != nil {
			p.stopWaitLocked()
			return 0, 0, false, err
		}
	}
	p.stopWaitLocked()
	if k >= p.cfg.Window && p.window {
		// Batch Window-1 was the window's last: joiners from now on wait
		// for the next epoch. Until this slot was taken, batches 0 to
		// Window-1 were all in the ring (Window <= Slots), so a consumer
		// joining during the wait above got them.
		p.window = false
		p.broadcastLocked()
	}
	w := p.ring.table.Word(s)
	gen = slots.Gen(w) + 1
	p.slot[s] = slotInfo{}
	p.ring.table.SetWord(s, slots.MakeWord(gen, stateWriting))
	return s, gen, true, nil
}

func (p *Producer) stopWaitLocked() {
	if !p.waitStart.IsZero() {
		p.st.WaitNS += int64(time.Since(p.waitStart))
		p.waitStart = time.Time{}
	}
}

// cutShortLocked ends epoch e after its k batches published: nobody takes
// part in it any more.
func (p *Producer) cutShortLocked(e int64, k int) {
	info := p.epochs[e]
	info.count, info.ended = k, true
	p.epochs[e] = info
	p.running, p.window = false, false
	p.st.CutShort++
	p.broadcastLocked()
}

// holdersLocked returns the consumers that still need the batch s holds.
func (p *Producer) holdersLocked(s slotInfo) []*member {
	var hs []*member
	for _, m := range p.members {
		if m.holds(s) {
			hs = append(hs, m)
		}
	}
	return hs
}

// publish makes the batch written into slot s visible: its record, its
// word, and the announcement to the consumers.
func (p *Producer) publish(s int, gen uint64, e int64, k, rows int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.ring.table
	t.SetField(s, fieldSeq, p.seq)
	t.SetField(s, fieldEpoch, uint64(e))
	t.SetField(s, fieldRows, uint64(rows))
	w := slots.MakeWord(gen, statePublished)
	t.SetWord(s, w)
	p.slot[s] = slotInfo{valid: true, seq: p.seq, epoch: e, index: k, rows: rows, word: w}
	p.seq++
	p.st.Published++
	p.broadcastLocked()
}

// reap drops the consumers that have been silent for Config.Heartbeat.
func (p *Producer) reap(ctx context.Context) {
	t := time.NewTicker(max(p.cfg.Heartbeat/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		dropped := false
		for id, m := range p.members {
			if time.Since(m.seen) > p.cfg.Heartbeat {
				delete(p.members, id)
				p.st.Dropped++
				dropped = true
			}
		}
		if dropped {
			p.broadcastLocked()
		}
		p.mu.Unlock()
	}
}

// joinInfo tells a consumer what it joined.
type joinInfo struct {
	id    uint64
	epoch int64 // its first epoch
}

// join adds a consumer of batch size batch: to the current epoch when its
// window is open, else to the next one.
func (p *Producer) join(batch int) (joinInfo, error) {
	if max := p.cfg.Slots * p.cfg.Batch; batch <= 0 || batch > max {
		return joinInfo{}, wrapf(ErrArgument, "batch size %d: want 1 to %d (the ring's %d slots of %d rows)",
			batch, max, p.cfg.Slots, p.cfg.Batch)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return joinInfo{}, err
	}
	m := &member{id: p.newIDLocked(), epoch: p.epoch + 1, seen: time.Now()}
	if p.running && p.window {
		m.epoch, m.released = p.epoch, p.epochs[p.epoch].first
	}
	p.members[m.id] = m
	p.st.Joined++
	p.broadcastLocked()
	return joinInfo{id: m.id, epoch: m.epoch}, nil
}

// newIDLocked returns a consumer id no member has: drawn at random (from
// 1 to 2^53-1, exact in every client's numbers), so that a call naming a
// consumer acts on that consumer only if its caller was told the id. With
// ids counted 1, 2, ..., a peer's stream or leave for a consumer that did
// not exist yet, handled after the next join, took that consumer and
// dropped it when it ended (FuzzService, once in CI). p.mu is held.
func (p *Producer) newIDLocked() uint64 {
	for {
		id := rand.Uint64N(1<<53-1) + 1
		if _, taken := p.members[id]; !taken {
			return id
		}
	}
}

// unusable is usableLocked under p.mu.
func (p *Producer) unusable() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.usableLocked()
}

// usableLocked returns ErrClosed or the producer's failure.
func (p *Producer) usableLocked() error {
	if p.gone != nil {
		if p.err != nil {
			return p.err // the producer process's own error first: it says why
		}
		return p.gone
	}
	if p.closed {
		return ErrClosed
	}
	return p.err
}

// memberLocked returns consumer id, or ErrDropped; touch marks it seen (the
// consumer itself spoke).
func (p *Producer) memberLocked(id uint64, touch bool) (*member, error) {
	if err := p.usableLocked(); err != nil {
		return nil, err
	}
	m := p.members[id]
	if m == nil {
		return nil, wrapf(ErrDropped, "consumer %d is not among the producer's (silent for more than %v, or slower than %v on one batch)",
			id, p.cfg.Heartbeat, p.cfg.MaxWait)
	}
	if touch {
		m.seen = time.Now()
	}
	return m, nil
}

// release records that consumer id is done with every batch before
// (epoch, index): index 0 of a later epoch than its own skips the rest of
// its epochs before it, one not begun yet included (a loop that ended
// before its epoch began gives that epoch up so). An epoch the producer
// has forgotten (pruneLocked: none of its batches is in the ring) is
// released whole: a consumer idle since it iterated it heartbeats its
// end, and still holds the batches after it. ErrArgument for a batch the
// producer never had. It also counts as a heartbeat.
func (p *Producer) release(id uint64, epoch int64, index int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, err := p.memberLocked(id, true)
	if err != nil {
		return err
	}
	if epoch < m.epoch {
		return nil // stale
	}
	info, started := p.epochs[epoch]
	var seq uint64
	switch {
	case started && index >= 0 && index <= info.count:
		seq = info.first + uint64(index)
	case !started && index == 0 && epoch > p.epoch:
		seq = 0 // the epoch has not begun: it releases everything before it
	case !started && epoch < p.epoch && index >= 0 && index <= p.nb:
		// Forgotten: every batch of it is older than those in the ring,
		// which the consumer has not released.
		seq = m.released
	default:
		return wrapf(ErrArgument, "release up to batch %d of epoch %d: no such batch", index, epoch)
	}
	if epoch > m.epoch {
		m.epoch, m.released = epoch, seq
	} else {
		m.released = max(m.released, seq)
	}
	p.broadcastLocked()
	return nil
}

// leave removes consumer id; dropped counts it as dropped (its stream
// broke) rather than gone by its own wish.
func (p *Producer) leave(id uint64, dropped bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.members[id]; ok {
		delete(p.members, id)
		if dropped {
			p.st.Dropped++
		} else {
			p.st.Left++
		}
		p.broadcastLocked()
	}
}

// announcement tells a consumer where a published batch is.
type announcement struct {
	Epoch int64  `codec:"epoch"`
	Index int    `codec:"index"` // in the epoch
	Count int    `codec:"count"` // batches in the epoch
	Slot  int    `codec:"slot"`
	Word  uint64 `codec:"word"` // the slot's word while it holds the batch
	Rows  int    `codec:"rows"`
}

// push returns the announcements of the published batches of consumer id
// from (*epoch, *index) on, all that are published, waiting until there is
// one or ctx ends; it moves the cursor past them. A cursor in an epoch the
// consumer has given up moves to the start of its epoch, and one past an
// epoch's last batch to the next epoch. Errors: ErrDropped for a consumer
// the producer no longer counts, or whose batch was overwritten.
func (p *Producer) push(ctx context.Context, id uint64, epoch *int64, index *int) ([]announcement, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		m, err := p.memberLocked(id, false)
		if err != nil {
			return nil, err
		}
		if *epoch < m.epoch {
			*epoch, *index = m.epoch, 0
		}
		if info, started := p.epochs[*epoch]; started {
			if *index >= info.count {
				*epoch, *index = *epoch+1, 0
				continue
			}
			if seq := info.first + uint64(*index); seq < p.seq {
				as, err := p.announceLocked(seq, info, maxAnnounce)
				if err != nil {
					return nil, err
				}
				last := as[len(as)-1]
				if *index = last.Index + 1; *index == last.Count {
					*epoch, *index = *epoch+1, 0
				}
				return as, nil
			}
		}
		if err := p.waitLocked(ctx, 0); err != nil {
			return nil, err
		}
	}
}

// announceLocked returns the announcements of the published batches from
// seq on, up to max, in epoch info.
func (p *Producer) announceLocked(seq uint64, info epochInfo, max int) ([]announcement, error) {
	var out []announcement
	end := info.first + uint64(info.count)
	for s := seq; s < p.seq && s < end && len(out) < max; s++ {
		si := p.slot[s%uint64(p.cfg.Slots)]
		if !si.valid || si.seq != s {
			if len(out) > 0 {
				break
			}
			return nil, wrapf(ErrDropped, "batch %d of epoch %d was overwritten: the consumer was not waited for", si.index, si.epoch)
		}
		out = append(out, announcement{Epoch: si.epoch, Index: si.index, Count: info.count, Slot: int(s % uint64(p.cfg.Slots)), Word: si.word, Rows: si.rows})
	}
	return out, nil
}

// copyBatch returns a copy, in Go memory, of the batch a announces, for a
// consumer that gets bytes. The consumer holds the batch, so it is not
// overwritten unless the consumer is dropped meanwhile: ErrDropped then.
// The copy is made in buf's first rows, and is a view of buf: buf is a
// TensorDict in Go memory of the producer's schema and of a ring slot's
// rows (batchCopies keeps them).
func (p *Producer) copyBatch(a announcement, buf *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	view, err := p.ring.slotView(a.Slot, a.Rows)
	if err != nil {
		return nil, err
	}
	td, err := buf.Slice(0, a.Rows)
	if err == nil {
		err = td.SetSlice(0, view)
	}
	if err != nil {
		return nil, err
	}
	slots.Fence()
	if p.ring.table.Word(a.Slot) != a.Word {
		return nil, wrapf(ErrDropped, "batch %d of epoch %d was overwritten while it was copied", a.Index, a.Epoch)
	}
	return td, nil
}

// Close stops the producer: its consumers' calls fail with ErrClosed, the
// ring is unmapped and removed (consumers that map it keep their mapping),
// the folder's lock released. MetaFile stays, so that a producer made
// again for the folder, with the same dataset and seed, begins with the
// next epoch.
func (p *Producer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.broadcastLocked()
	p.mu.Unlock()
	p.stop()
	<-p.done
	var perr error
	if p.pipe != nil {
		perr = p.pipe.close()
	}
	return errors.Join(p.ring.close(true), perr)
}

// truncatedFiles names the mapped files of tds shorter than their
// mappings, as ": truncated: PATH (N of M bytes), ...", or "" when none
// is: a fault's address does not say whose mapping it was in (a gather
// faults on the dataset or on the ring slot it writes).
func truncatedFiles(tds ...*tensordict.TensorDict) string {
	var out []string
	for _, td := range tds {
		if td == nil {
			continue
		}
		for _, t := range td.Leaves() {
			mm, _ := t.Mapping()
			if mm == nil {
				continue
			}
			if fi, err := os.Stat(mm.Path()); err == nil && fi.Size() < int64(mm.NumBytes()) {
				out = append(out, fmt.Sprintf("%s (%d of %d bytes)", mm.Path(), fi.Size(), mm.NumBytes()))
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return ": truncated: " + strings.Join(out, ", ")
}
