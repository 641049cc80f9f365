package loader

// A consumer against a node that answers badly (fakeNode): what FuzzConsumer
// found, one test each.

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"
)

// TestConsumer_BadJoinResponse: a join response no producer gives (a ring
// of no slots or of more than the producer allows, no samples or so many
// that an epoch's batches cannot be counted, a negative epoch or
// heartbeat, a ring smaller than the consumer's batch) is an error at
// Dial, not a panic or a channel of a terabyte.
func TestConsumer_BadJoinResponse(t *testing.T) {
	n := newFakeNode(t)
	for _, tc := range []struct {
		name   string
		change func(*joinResponse)
	}{
		{"negative slots", func(j *joinResponse) { j.Slots = -3 }},
		{"no slots", func(j *joinResponse) { j.Slots = 0 }},
		{"no batch", func(j *joinResponse) { j.Batch = 0 }},
		{"2^40 slots", func(j *joinResponse) { j.Slots = 1 << 40 }},
		{"a ring of 2^31+1 rows", func(j *joinResponse) { j.Slots, j.Batch = 1<<31+1, 1 }},
		{"no samples", func(j *joinResponse) { j.Samples = 0 }},
		{"the most samples an int holds", func(j *joinResponse) { j.Samples = math.MaxInt }},
		{"a negative epoch", func(j *joinResponse) { j.Epoch = -5 }},
		{"the last epoch", func(j *joinResponse) { j.Epoch = math.MaxInt64 }},
		{"a negative heartbeat", func(j *joinResponse) { j.HeartbeatMS = -1 }},
		{"a ring smaller than the batch", func(j *joinResponse) { j.Slots, j.Batch = 1, 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix, _ := n.newRing(t)
			s := n.honest(prefix, true)
			tc.change(&s.join)
			n.play(s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Dial(ctx, n.addr, "train", Options{Batch: fakeBatch})
			if err == nil {
				c.Close()
				t.Fatalf("Dial succeeded against %+v (Len %d)", s.join, c.Len())
			}
			t.Log(err)
		})
	}
}

// TestConsumer_BadAnnouncement: an announcement no producer makes for the
// batch the consumer waits for (an epoch of another count, a batch of
// other rows than its place in the epoch gives, a slot outside the ring)
// ends the loop with an error, by reference and by bytes, rather than an
// epoch of the wrong samples or a read of another slot.
func TestConsumer_BadAnnouncement(t *testing.T) {
	n := newFakeNode(t)
	for _, tc := range []struct {
		name   string
		change func(a *announcement)
	}{
		{"an epoch of one batch", func(a *announcement) { a.Count = 1 }},
		{"an epoch of three batches", func(a *announcement) { a.Count = 3 }},
		{"two rows", func(a *announcement) {
			if a.Index == 1 {
				a.Rows = 2
			}
		}},
		{"slot 2^62, which wraps round to slot 0's rows", func(a *announcement) {
			if a.Index == 1 {
				a.Slot = 1 << 62
			}
		}},
		{"slot -1", func(a *announcement) {
			if a.Index == 1 {
				a.Slot = -1
			}
		}},
	} {
		for _, bytes := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/bytes=%v", tc.name, bytes), func(t *testing.T) {
				prefix, _ := n.newRing(t)
				s := n.honest(prefix, bytes)
				for i := range s.msgs {
					tc.change(&s.msgs[i].Batch)
					if bytes {
						s.msgs[i].Rows = n.rowsVariant(t, 0, s.msgs[i].Batch)
					}
				}
				n.play(s)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				opts := Options{Batch: fakeBatch, Root: n.root, Bytes: bytes}
				c, err := Dial(ctx, n.addr, "train", opts)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				ids, sizes, err := consumerEpoch(ctx, c)
				if err == nil {
					t.Fatalf("an epoch of batches %v, samples %v, from %v", sizes, ids, s)
				}
				if ctx.Err() != nil {
					t.Fatalf("the loop did not end: %v", err)
				}
				t.Log(err)
			})
		}
	}
}

// TestConsumer_BadRows: rows sent in bytes mode that are not the joined
// schema's (a field missing, of another dtype, one more) end the loop
// with an error; the consumer yields no batch whose missing field holds
// what an earlier batch left in its buffer.
func TestConsumer_BadRows(t *testing.T) {
	n := newFakeNode(t)
	for _, tc := range []struct {
		name string
		kind int64 // fakeNode.rowsVariant
	}{
		{"none", 1},
		{"only the labels", 3},
		{"labels of int32", 4},
		{"a field more", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := n.honest("", true)
			s.msgs[1].Rows = n.rowsVariant(t, tc.kind, s.msgs[1].Batch)
			n.play(s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Dial(ctx, n.addr, "train", Options{Batch: fakeBatch})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var loopErr error
			for b, err := range c.Batches(ctx) {
				if err != nil {
					loopErr = err
					break
				}
				if _, err := sampleIDs(b); err != nil {
					t.Fatalf("a batch of rows that are no sample: %v", err)
				}
			}
			if loopErr == nil || ctx.Err() != nil {
				t.Fatalf("the loop ended with %v, want an error", loopErr)
			}
			t.Log(loopErr)
		})
	}
}

// TestConsumer_DescribedRowsAllocateNothing: a node that describes rows
// of 64 MiB and then sends rows of another schema gets an error, and the
// consumer allocates no batch buffer for rows it never received (before,
// it allocated its buffers for batch × the described row at the loop's
// start: 768 MiB here, and a terabyte a row was a fatal out of memory).
func TestConsumer_DescribedRowsAllocateNothing(t *testing.T) {
	n := newFakeNode(t)
	s := n.honest("", true)
	s.join.Schema[0].Shape = []int{1 << 13, 1 << 13}
	n.play(s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, n.addr, "train", Options{Batch: fakeBatch})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var loopErr error
	for _, err := range c.Batches(ctx) {
		if err != nil {
			loopErr = err
			break
		}
		t.Fatal("a batch of rows of another schema")
	}
	runtime.ReadMemStats(&after)
	if loopErr == nil {
		t.Fatal("the loop ended without an error")
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<20 {
		t.Errorf("the loop allocated %d MiB before its first batch's rows were refused (%v)", got>>20, loopErr)
	}
}
