package collective

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// inboxMsg is message i of the inbox tests: 100+i bytes of value i+1.
func inboxMsg(t *testing.T, i int) *tensordict.Tensor {
	t.Helper()
	x, err := tensordict.FromBytes(memmap.Uint8, []int{100 + i}, bytes.Repeat([]byte{byte(i + 1)}, 100+i))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// within polls cond for up to 10 s.
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	svctest.Poll(t, 10*time.Second, what, cond)
}

func linuxOnly(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
}

// TestInbox_RingFullGoesOverRPC: a sender with more messages in flight to
// one rank than its ring there has entries sends the rest over rpc; the
// receiver takes them all, in any order, bit for bit.
func TestInbox_RingFullGoesOverRPC(t *testing.T) {
	linuxOnly(t)
	comms := group(t, 2, SHM)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 3 * inboxSlots
	var reqs []*Request
	for i := range n {
		reqs = append(reqs, comms[0].Isend(ctx, inboxMsg(t, i), 1, i))
	}
	// Every message waits at rank 1 (its inbox's handlers, or rpc's),
	// none received yet.
	box := comms[1].box
	within(t, "every message at the receiver", func() bool {
		box.mu.Lock()
		defer box.mu.Unlock()
		return len(box.slots) == n
	})
	for i := n - 1; i >= 0; i-- {
		y, _ := tensordict.Zeros(memmap.Uint8, 100+i)
		if err := comms[1].Recv(ctx, y, 0, i); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		got, _ := y.Bytes()
		if want, _ := inboxMsg(t, i).Bytes(); !bytes.Equal(got, want) {
			t.Errorf("message %d differs", i)
		}
	}
	for i, r := range reqs {
		if err := r.Wait(ctx); err != nil {
			t.Errorf("send %d: %v", i, err)
		}
	}
	if rung, sent := comms[0].p2pStat.rung.Load(), comms[0].p2pStat.sent.Load(); rung != inboxSlots || sent != n {
		t.Errorf("%d messages through the inbox of %d by reference, want %d (the ring's entries) of %d", rung, sent, inboxSlots, n)
	}
}

// TestInbox_GivenUpEntriesReclaimed: sends whose context ends while the
// receiver's handler waits for a receive that never comes end that wait
// (cancel), and their entries are the sender's again: after three rings'
// worth of them, a message still goes through the inbox.
func TestInbox_GivenUpEntriesReclaimed(t *testing.T) {
	linuxOnly(t)
	comms := group(t, 2, SHM)
	for i := range 3 * inboxSlots {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := comms[0].Send(ctx, inboxMsg(t, i), 1, 1000+i)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("send %d: %v, want its deadline", i, err)
		}
	}
	b := comms[1].ownInbox()
	within(t, "the receiver's handlers ended", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.cancels) == 0
	})
	before := comms[0].p2pStat.rung.Load()
	all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, inboxMsg(t, 5), 1, 5)
		}
		y, _ := tensordict.Zeros(memmap.Uint8, 105)
		return 0, c.Recv(ctx, y, 0, 5)
	})
	if got := comms[0].p2pStat.rung.Load() - before; got != 1 {
		t.Errorf("the message after went %d times through the inbox, want 1: the entries given up on were not reclaimed", got)
	}
	box := comms[1].box
	box.mu.Lock()
	defer box.mu.Unlock()
	if len(box.slots) != 0 {
		t.Errorf("%d messages given up on still wait at the receiver", len(box.slots))
	}
}

// TestInbox_MalformedEntry: an entry whose first piece is longer than an
// entry holds is answered with an error saying so, and the inbox goes on
// working.
func TestInbox_MalformedEntry(t *testing.T) {
	linuxOnly(t)
	comms := group(t, 2, SHM)
	c := comms[0]
	p, i, ok := c.inboxes.acquire(c.p2pDir(1), 0, 1, 2)
	if !ok {
		t.Fatal("no entry in rank 1's inbox")
	}
	base := inboxHeader + 0*inboxRing + i*inboxEntry
	e := p.m.Bytes()[base : base+inboxEntry]
	encodeEntry(e, msgKey{seq: 0, tag: 77}, meta(memmap.Float64, []int{4}), &p2pRef{Gen: 1, ID: 1, Len: 32, Size: arenaMin})
	binary.LittleEndian.PutUint32(e[beMetaLen:], 999)
	use := p.uses[i] << 3
	st := p.m.Uint32(base + beState)
	st.Store(use | entryPosted)
	c.ring(p.m)
	within(t, "an answer", func() bool { return st.Load() == use|entryAnswered })
	if err := entryAnswer(e, 1); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("answer %v, want it refused as malformed", err)
	}
	c.inboxes.release(p, i, false)
	all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, inboxMsg(t, 1), 1, 1)
		}
		y, _ := tensordict.Zeros(memmap.Uint8, 101)
		return 0, c.Recv(ctx, y, 0, 1)
	})
	if c.p2pStat.rung.Load() != 1 {
		t.Errorf("%d messages through the inbox, want 1", c.p2pStat.rung.Load())
	}
}

// FuzzInboxEntry: an entry of an inbox, written by another process, is any
// bytes here. decodeEntry returns an error or a message whose first piece
// fits an entry and which encodes back to the same message; entryAnswer
// returns nil or an error; neither panics.
func FuzzInboxEntry(f *testing.F) {
	for _, g := range wireGolden {
		if strings.HasPrefix(g.name, "inbox ") {
			f.Add(g.raw)
		}
	}
	f.Add(make([]byte, inboxEntry))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := make([]byte, inboxEntry)
		copy(e, b)
		_ = entryAnswer(e, 1)
		req, m, err := decodeEntry(e, 1)
		if err != nil {
			return
		}
		if len(m) > inboxMetaMax || req.Ref == nil || req.Space != spaceP2P || req.Src != 1 {
			t.Fatalf("decoded %+v with a first piece of %d bytes", req, len(m))
		}
		again := make([]byte, inboxEntry)
		encodeEntry(again, msgKey{seq: req.Seq, tag: req.Tag}, m, req.Ref)
		req2, m2, err := decodeEntry(again, 1)
		if err != nil || !reflect.DeepEqual(req, req2) || !bytes.Equal(m, m2) {
			t.Fatalf("round trip: %+v %x, then %+v %x, %v", req, m, req2, m2, err)
		}
	})
}

// TestInbox_Truncated: a rank's inbox truncated by hand is a fault of
// that rank's own (its loop breaks it off, never the process), which the
// other ranks hear as ErrAborted naming it rather than wait for answers;
// messages to it that find the file short go over rpc.
func TestInbox_Truncated(t *testing.T) {
	linuxOnly(t)
	comms := group(t, 2, SHM)
	all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, inboxMsg(t, 1), 1, 1)
		}
		y, _ := tensordict.Zeros(memmap.Uint8, 101)
		return 0, c.Recv(ctx, y, 0, 1)
	})
	if err := os.Truncate(comms[1].ownInbox().path, 0); err != nil {
		t.Fatal(err)
	}
	within(t, "rank 1 broken off with its fault", func() bool { return errors.Is(comms[1].err(), memmap.ErrFault) })
	within(t, "rank 0 told", func() bool { return errors.Is(comms[0].err(), ErrAborted) })
	if err := comms[0].err(); !strings.Contains(err.Error(), "rank 1's inbox faulted") {
		t.Errorf("rank 0: %v, want rank 1's inbox named", err)
	}
}
