package loader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tensorwire/tensorwire/internal/slots"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// assemble fills batches of size batch from the producer's batches of
// epoch, in order, less the first skip samples of the consumer's share
// (Resume), and sends them on out (closed at the epoch's end); it takes
// buffers from pool. An error is sent as the last item.
func (s *session) assemble(ctx context.Context, epoch int64, skip, batch int, dropLast bool, out chan<- assembled, pool <-chan *batchBuf) {
	fail := func(err error) {
		select {
		case out <- assembled{err: err}:
		case <-ctx.Done():
		}
	}
	// A rank's share (Options.WorldSize): its rows of each batch, and the
	// padding, kept aside until the epoch's end, where it ends the share.
	sh := newShare(s.c.o.Rank, s.c.o.WorldSize, s.info.Samples)
	// With views (Options.Views), a batch within one producer batch is a
	// view of it; the others are copied. A producer batch is released
	// once it is cut (copied, or skipped whole by Resume), as without
	// views, but never past a view the loop is not done with (rel).
	views := s.c.o.Views && sh == nil
	rel := &releases{s: s, epoch: epoch}
	var cur *batchBuf
	pos, index := 0, 0
	send := func(n int) bool {
		select {
		case out <- assembled{buf: cur, n: n}:
			cur, pos = nil, 0
			return true
		case <-ctx.Done():
			return false
		}
	}
	// hold counts the uses of the rows of the batch being cut (by bytes).
	var hold *held
	// sendView sends rows [off, off+n) of the batch a announces as a view.
	sendView := func(a announcement, rows *tensordict.TensorDict, off, n int) bool {
		td, check, err := s.view(a, rows, off, n)
		if err != nil {
			fail(err)
			return false
		}
		h := hold
		h.add() // the view reads the rows until the loop is done with it
		rel.hold(a.Index)
		item := assembled{td: td, n: n, done: func(used bool) error {
			err := check(used) // before the release lets the slot be written again
			rel.unhold(a.Index)
			h.drop()
			return err
		}}
		select {
		case out <- item:
			return true
		case <-ctx.Done():
			item.done(false)
			return false
		}
	}
	// take cuts n rows of the batch a announces into batches: those at
	// offsets sel, or its first n when sel is nil.
	take := func(a announcement, rows *tensordict.TensorDict, sel []int, n int) bool {
		for off := 0; off < n; {
			if views && cur == nil && sel == nil {
				// A batch within this one is a view of it; the epoch's
				// last, short batch too (unless dropped).
				k := min(batch, n-off)
				last := a.Index+1 == a.Count && off+k == n
				if k == batch || last {
					if k < batch && dropLast {
						off += k
						continue
					}
					if !sendView(a, rows, off, k) {
						return false
					}
					off += k
					continue
				}
			}
			if cur == nil {
				select {
				case cur = <-pool:
				case <-ctx.Done():
					return false
				}
				// Rows of the schema have come (checked in next), or
				// the ring that holds them is mapped: only now is
				// the batch's memory more than a node's word.
				if err := cur.alloc(); err != nil {
					fail(err)
					return false
				}
			}
			k := min(batch-pos, n-off)
			var err error
			if sel == nil {
				err = s.copyRows(cur, pos, a, rows, off, k)
			} else {
				err = s.copySel(cur, pos, a, rows, sel[off:off+k])
			}
			if err != nil {
				fail(err)
				return false
			}
			pos += k
			off += k
			if pos == batch && !send(batch) {
				return false
			}
		}
		return true
	}
	var stash *batchBuf
	var sel []int
	if sh != nil && len(sh.pad) > 0 {
		stash = newBatchBuf(s.schema, len(sh.pad))
	}
	for {
		anns, rows, h, err := s.next(ctx, epoch, index)
		hold = h
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, rpc.ErrUnavailable) {
				return // the loop stopped
			}
			fail(err)
			return
		}
		for _, a := range anns {
			if sh == nil && skip > 0 {
				// Resumed: the batch's rows past those skipped.
				k := min(skip, a.Rows)
				skip -= k
				sel = span(sel[:0], k, a.Rows)
				if !take(a, rows, sel, len(sel)) {
					return
				}
			} else if sh == nil {
				if !take(a, rows, nil, a.Rows) {
					return
				}
			} else {
				first := a.Index * s.info.Batch
				for i, e := range sh.pad {
					if e >= first && e < first+a.Rows {
						err := stash.alloc()
						if err == nil {
							err = s.copySel(stash, i, a, rows, []int{e - first})
						}
						if err != nil {
							fail(err)
							return
						}
					}
				}
				sel = sh.own(sel[:0], first, a.Rows)
				k := min(skip, len(sel))
				skip -= k
				if !take(a, rows, sel[k:], len(sel)-k) {
					return
				}
			}
			// Cut: what still reads the batch's rows is the views sent.
			hold.drop()
			rel.cut(a.Index + 1)
			index = a.Index + 1
			if index == a.Count {
				if stash != nil && skip < len(sh.pad) {
					// The padding ends the share (less what Resume skips).
					sel = span(sel[:0], skip, len(sh.pad))
					if !take(announcement{}, stash.td, sel, len(sel)) {
						return
					}
				}
				if pos > 0 && !dropLast && !send(pos) {
					return
				}
				select {
				case out <- assembled{end: true}:
				case <-ctx.Done():
				}
				return
			}
		}
	}
}

// next returns the batch of epoch at index, as its stream brings it, and
// its rows in bytes mode, held once for the caller (drop it when done
// cutting them); it passes over the batches before it (of an epoch the
// loop gave up).
func (s *session) next(ctx context.Context, epoch int64, index int) ([]announcement, *tensordict.TensorDict, *held, error) {
	for {
		var m inbound
		var ok bool
		select {
		case m, ok = <-s.msgs:
		case <-ctx.Done():
			return nil, nil, nil, ctx.Err()
		}
		if !ok {
			return nil, nil, nil, fmt.Errorf("loader: epoch %d, batch %d: %w", epoch, index, s.streamErr())
		}
		a, rows, err := s.check(m.batchMessage, epoch, index)
		if a == nil && err == nil {
			m.release()
			continue
		}
		if err != nil {
			m.release()
			return nil, nil, nil, err
		}
		return []announcement{*a}, rows, newHeld(m.release), nil
	}
}

// check checks m as the batch of epoch at index and returns its
// announcement and (in bytes mode) its rows; a nil announcement and error
// for a batch before it, to pass over.
func (s *session) check(m batchMessage, epoch int64, index int) (*announcement, *tensordict.TensorDict, error) {
	a := m.Batch
	if a.Epoch < epoch || (a.Epoch == epoch && a.Index < index) {
		return nil, nil, nil
	}
	if a.Epoch != epoch || a.Index != index {
		return nil, nil, fmt.Errorf("loader: waiting for batch %d of epoch %d, got %d of %d", index, epoch, a.Index, a.Epoch)
	}
	if err := s.checkAnnouncement(a); err != nil {
		return nil, nil, err
	}
	var rows *tensordict.TensorDict
	if s.bytes {
		if m.Rows == nil || m.Rows.TensorDict == nil || m.Rows.Len() != a.Rows {
			return nil, nil, fmt.Errorf("loader: batch %d of epoch %d came without its %d rows", index, epoch, a.Rows)
		}
		if err := s.schema.Match(m.Rows.RowSchema()); err != nil {
			return nil, nil, fmt.Errorf("loader: the rows of batch %d of epoch %d are not the joined schema's: %w", index, epoch, err)
		}
		rows = m.Rows.TensorDict
	}
	return &a, rows, nil
}

// held counts the uses of a batch's rows that came as bytes: the
// assembler's while it cuts them into batches (copies, or views), and each
// view of them the loop is not yet done with. The last drop gives their
// memory back to the stream (inbound.release) for a later batch. Its
// methods are safe for concurrent use; a nil *held does nothing.
type held struct {
	n       atomic.Int32
	release func()
}

func newHeld(release func()) *held {
	h := &held{release: release}
	h.n.Store(1)
	return h
}

func (h *held) add() {
	if h != nil {
		h.n.Add(1)
	}
}

func (h *held) drop() {
	if h != nil && h.n.Add(-1) == 0 {
		h.release()
	}
}

// releases is what an epoch's assembler releases of the producer's
// batches (session.release): every batch it has cut (copied out, or
// skipped whole by Resume) up to the first one that a view the loop is not
// yet done with lies in (Options.Views). A copied batch thus frees its
// slots as it is copied, with views as without. (With views it held them
// until the loop was done with it, so a batch of 30 rows spanning three
// slots of a ring of two waited for a slot it held itself until the
// producer dropped the consumer.) Its methods are safe for concurrent
// use: the assembler cuts, the loop's goroutine is done with views.
type releases struct {
	s     *session
	epoch int64

	mu   sync.Mutex
	to   int   // every batch before to is cut
	held []int // the batch of each view not yet done with, in order
}

// cut records that every batch before to is cut, and releases what no
// view holds.
func (r *releases) cut(to int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.to = max(r.to, to)
	r.releaseLocked()
}

// hold records a view of batch index, which the loop reads until unhold.
// Views come in the order of their batches.
func (r *releases) hold(index int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = append(r.held, index)
}

// unhold records that the loop is done with a view of batch index (one
// given to hold), and releases what that frees.
func (r *releases) unhold(index int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := slices.Index(r.held, index); i >= 0 {
		r.held = slices.Delete(r.held, i, i+1)
	}
	r.releaseLocked()
}

// releaseLocked releases up to the first batch held, or the batches cut
// when none is; r.mu is held.
func (r *releases) releaseLocked() {
	to := r.to
	if len(r.held) > 0 {
		to = min(to, r.held[0])
	}
	r.s.release(r.epoch, to)
}

// checkAnnouncement checks that a is what the producer the session joined
// announces for batch a.Index of an epoch: the epoch's count of batches,
// the rows of the batch at that place, a slot of the ring holding a
// published batch.
func (s *session) checkAnnouncement(a announcement) error {
	i := s.info
	count := (i.Samples + i.Batch - 1) / i.Batch
	rows := 0
	if a.Index >= 0 && a.Index < count {
		rows = min(i.Batch, i.Samples-a.Index*i.Batch)
	}
	if a.Count != count || a.Rows != rows || a.Slot < 0 || a.Slot >= i.Slots || slots.State(a.Word) != statePublished {
		return fmt.Errorf("loader: the node announced batch %d of epoch %d as %+v; a producer of %d samples in batches of %d, "+
			"with %d slots, announces %d batches, this one of %d rows, in a published slot", a.Index, a.Epoch, a,
			i.Samples, i.Batch, i.Slots, count, rows)
	}
	return nil
}

// copyRows copies rows [off, off+n) of the batch a announces into dst at
// row pos: from the ring (then checks the slot's word: a batch overwritten
// while it was copied is ErrDropped), or from rows, the batch's bytes.
func (s *session) copyRows(dst *batchBuf, pos int, a announcement, rows *tensordict.TensorDict, off, n int) error {
	if rows != nil {
		part, err := rows.Slice(off, off+n)
		if err != nil {
			return err
		}
		view, err := dst.td.Slice(pos, pos+n)
		if err != nil {
			return err
		}
		return gatherFrom(view, part)
	}
	r := s.reader
	for i, l := range r.leaves {
		rb := dst.rb[i]
		at := l.off + int64(a.Slot*r.batch+off)*int64(rb)
		if _, err := l.mm.ReadAt(dst.leaves[i][pos*rb:(pos+n)*rb], at); err != nil {
			return err
		}
	}
	return r.unchanged(a, "it was read")
}

// maxViews bounds the views a session keeps (a small consumer batch of a
// large ring has many places); the others are made each time.
const maxViews = 1024

// view returns rows [off, off+n) of the batch a announces without copying
// them (Options.Views): a view of the ring's mapping, or of rows, the
// batch's bytes. done(used) is called once the loop is done with it: the
// mapping is kept until then (Close waits for it to unmap), and with used
// it checks the slot's word, ErrDropped if the slot was rewritten while
// the view was read.
func (s *session) view(a announcement, rows *tensordict.TensorDict, off, n int) (td *tensordict.TensorDict, done func(used bool) error, err error) {
	if rows != nil {
		td, err := rows.Slice(off, off+n)
		return td, func(bool) error { return nil }, err
	}
	r := s.reader
	if !r.acquire() {
		return nil, nil, wrapf(ErrClosed, "the ring was unmapped")
	}
	check := func() error { return r.unchanged(a, "the loop read it") }
	start := a.Slot*r.batch + off
	key := [2]int{start, n}
	if td = s.views[key]; td == nil {
		if td, err = r.joined.Slice(start, start+n); err == nil {
			if s.views == nil {
				s.views = map[[2]int]*tensordict.TensorDict{}
			}
			if len(s.views) < maxViews {
				s.views[key] = td
			}
		}
	}
	if err == nil {
		err = check()
	}
	if err != nil {
		r.done()
		return nil, nil, err
	}
	return td, func(used bool) error {
		defer r.done()
		if used {
			return check()
		}
		return nil
	}, nil
}

// gatherFrom copies src's tensors into dst's of the same keys (same row
// counts).
func gatherFrom(dst, src *tensordict.TensorDict) error {
	for path, t := range src.Leaves() {
		d, err := dst.Tensor(path...)
		if err != nil {
			return err
		}
		if err := d.SetSlice(0, t); err != nil {
			return err
		}
	}
	return nil
}

// span appends the rows from, from+1, ..., to-1 to sel.
func span(sel []int, from, to int) []int {
	for o := from; o < to; o++ {
		sel = append(sel, o)
	}
	return sel
}
