package collective

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
)

// A collective runs in three parts on every transport: each rank
// publishes its description (and, with shared mappings, its data), every
// rank checks all descriptions the same way (check), and the data moves by
// the agreed plan. An error in the first two parts is the same on every
// rank and leaves the communicator usable; one in the third breaks it.

// call is one rank's part of a collective.
type call struct {
	d   desc
	in  []byte // this rank's input; nil when it has none
	out []byte // the output given (Into); nil: allocated once the plan is known
}

// collective runs cl and returns the plan and this rank's output (nil when
// it gets none).
func (c *Comm) collective(ctx context.Context, cl *call) (*plan, []byte, error) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if err := c.err(); err != nil {
		return nil, nil, err
	}
	seq := c.seq
	c.seq++
	c.inflight.Store(int64(seq))
	defer c.inflight.Store(-1)
	if err := c.checkGone(seq); err != nil {
		return nil, nil, err
	}
	ctx, release := c.untilBroken(ctx)
	defer release()

	var p *plan
	var out []byte
	var err error
	switch {
	case c.shm != nil:
		p, out, err = c.shmCollective(ctx, seq, cl)
	case c.hier != nil:
		p, out, err = c.hierCollective(ctx, seq, cl)
	default:
		p, out, err = c.tcpCollective(ctx, seq, cl)
	}
	if e := c.cause(); err != nil && e != nil {
		if o := c.ownAbort.Load(); o != nil && *o == e {
			// This rank broke off: its context ended, not another rank.
			return nil, nil, c.ownCause
		}
		return nil, nil, e
	}
	// Done, or failed its checks on every rank: either way every rank
	// went through it to the end.
	c.completed.Store(seq + 1)
	return p, out, err
}

// output returns the output buffer for rank me under p: cl.out, or a new
// one.
func (cl *call) output(p *plan, me int) []byte {
	shape := p.outShape(me)
	if shape == nil {
		return nil
	}
	if cl.out != nil {
		return cl.out
	}
	return make([]byte, numel(shape)*p.esize)
}

// failData breaks the communicator after an error in a data phase: the
// ranks no longer agree on where they are. How the others learn of it
// depends on whose the error is:
//
//   - this rank's context ended: it breaks off and tells the others
//     (their watches of it end with ErrAborted), and returns its
//     context's cause;
//   - an error of this rank's own (an ownError: a fault on a buffer, a
//     malformed message it received): it breaks off the same way, so that
//     ranks waiting for its messages, with nothing else to tell them,
//     fail at once rather than at their deadlines; it returns err;
//   - anything else (ErrPeerLost, ErrAborted, a peer's answer): another
//     rank's failure, which the others hear of from that rank; this rank
//     only breaks locally, so that those errors keep their meaning on
//     every survivor.
func (c *Comm) failData(ctx context.Context, err error) error {
	if c.shm != nil {
		c.shm.abort()
	}
	if c.hier != nil {
		c.hier.abort()
	}
	if e := c.cause(); e != nil {
		return e
	}
	if ctx.Err() != nil {
		// Our context ended: we break off, and tell the others (their
		// watches of us end with ErrAborted).
		cause := context.Cause(ctx)
		err = errorf(ErrAborted, "rank %d broke off collective %d: %v", c.rank, c.seq-1, cause)
		own := fmt.Errorf("collective: rank %d (this rank) broke off collective %d: %w", c.rank, c.seq-1, cause)
		c.failOwn(err, own)
		return own
	}
	if isOwn(err) {
		return c.breakOff(c.seq-1, err)
	}
	c.fail(err)
	return err
}

// breakOff breaks the communicator for err, an error of this rank's own in
// the data phase of collective seq, as a rank whose context ended does:
// its watches end with ErrAborted naming it and why, so every other rank
// fails at once. Its own call returns err (or, when another cause broke
// the communicator first, that cause).
func (c *Comm) breakOff(seq uint64, err error) error {
	ab := errorf(ErrAborted, "rank %d broke off collective %d: %v", c.rank, seq, err)
	if c.failOwn(ab, err) {
		return err
	}
	return c.cause()
}

// gaveUp is what this rank answers a message's sender when it stopped
// waiting for the message because it is breaking off the collective, so
// that every rank reports the rank that failed first:
//
//   - the communicator's cause, once it is broken;
//   - else why, the error that ended this rank's data phase (its
//     firstError, the cause of the context its consumers wait under),
//     when that is another rank's failure (ErrAborted, ErrPeerLost): a
//     rank that stops because rank 1 broke off says that rank 1 broke
//     off. It has heard but not yet broken (failData runs once its sends
//     and receives have ended), and an answer naming itself would be the
//     first error of a rank that had not heard from rank 1 yet, which
//     then reports the wrong rank;
//   - else ErrAborted naming this rank.
//
// Never the bare context error, which the sender could not tell from its
// own.
func (c *Comm) gaveUp(why error) error {
	if e := c.cause(); e != nil {
		return e
	}
	if why != nil && !isOwn(why) && (errors.Is(why, ErrAborted) || errors.Is(why, ErrPeerLost)) {
		return why
	}
	return errorf(ErrAborted, "rank %d gave up on the message", c.rank)
}

// ownError marks an error this rank found itself in a collective's data
// phase, as opposed to one caused by another rank (ErrPeerLost, ErrAborted)
// or its context: a fault on a buffer it reads or writes (a mapping whose
// file was truncated), a message whose length is not the one agreed. It
// changes nothing but how failData tells the others (see there): it
// unwraps to the error, and only ever wraps errors on this rank (a
// message's sender gets the plain error back).
type ownError struct{ err error }

func (e *ownError) Error() string { return e.err.Error() }
func (e *ownError) Unwrap() error { return e.err }

// ownErr marks err (when not nil) as this rank's own.
func ownErr(err error) error {
	if err == nil || isOwn(err) {
		return err
	}
	return &ownError{err}
}

// guardOwn runs fn under memmap's fault guard: a fault on a mapping inside
// it (a buffer whose file was truncated) ends fn with an error of this
// rank's own wrapping memmap.ErrFault, not the process; fn's own error
// passes through unchanged.
func guardOwn(fn func() error) error {
	var err error
	if fault := memmap.Guard(func() error { err = fn(); return nil }); fault != nil {
		return ownErr(fault)
	}
	return err
}

// isOwn reports whether err is marked as this rank's own.
func isOwn(err error) bool {
	var o *ownError
	return errors.As(err, &o)
}

// abortCauseWait is how long a rank that sees another give up a
// collective waits for the communicator's own news of why (causeWithin).
// The news always comes (the rank that gave up ends its watches with
// ErrAborted and its cause, or was given up for another rank's failure,
// which this rank's watches hear of too; a rank that died is ErrPeerLost)
// and within milliseconds on an idle machine, but under load (the race
// detector on two busy cores) it took more than the 50 ms this was: the
// rank then reported "rank N abandoned collective M" without the cause.
// The bound is only against news that never comes.
const abortCauseWait = 2 * time.Second

// causeWithin returns the communicator's error once it has one, waiting
// for it up to d (or ctx's end): nil if none came. A rank that sees
// another abandon a collective (its abort word) prefers the reason, when
// its watches learn it at once (ErrPeerLost of the rank that died, not
// ErrAborted of the rank that gave up because of it).
func (c *Comm) causeWithin(ctx context.Context, d time.Duration) error {
	if err := c.err(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.broke.Done():
		return c.err()
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}
