package loader

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestProducer_LateJoiners: the first consumer joins and reads nothing,
// so the producer fills the ring and waits. A consumer joining then gets
// the producer's current epoch whole, the batches published before it
// joined included, while the window is open (the producer has not taken a
// slot for the epoch's batch Window), and starts at the next epoch
// otherwise.
func TestProducer_LateJoiners(t *testing.T) {
	const b, seed = 10, 4
	for _, tc := range []struct {
		name        string
		n, slots    int
		window      int
		waitEpoch   int64 // where the producer waits
		waitInEpoch int
		wantEpoch   int64
	}{
		// 3 batches an epoch: epoch 0 in slots 0-2, epoch 1's batch 0 in
		// slot 3, its batch 1 waits for slot 0.
		{"open", 30, 4, 2, 1, 1, 1},
		{"open until batch Window is written", 30, 4, 1, 1, 1, 1},
		{"none", 30, 4, -1, 1, 1, 2},
		// 4 batches an epoch: epoch 0's batch 3 waits for slot 0, the
		// window of 1 closed when batch 1 was written.
		{"closed", 40, 3, 1, 0, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.n, Config{Batch: b, Slots: tc.slots, Window: tc.window, Seed: seed})
			first := f.dial(t, b, false)
			waitFor(t, "the producer waiting for a slot", func() bool {
				st := f.p.Stats()
				return st.Epoch == tc.waitEpoch && st.InEpoch == tc.waitInEpoch && st.WaitNS > 0
			})
			late := f.dial(t, b, true)
			if got := late.Epoch(); got != tc.wantEpoch {
				t.Fatalf("the late consumer starts at epoch %d, want %d", got, tc.wantEpoch)
			}
			ctx := context.Background()
			done := make(chan error, 1)
			go func() {
				for first.Epoch() <= tc.wantEpoch {
					e := first.Epoch()
					ids, sizes, err := consumerEpoch(ctx, first)
					if err == nil {
						err = checkEpoch(ids, sizes, tc.n, seed, e, b)
					}
					if err != nil {
						done <- fmt.Errorf("first consumer: %w", err)
						return
					}
				}
				done <- nil
			}()
			ids, sizes, err := consumerEpoch(ctx, late)
			if err == nil {
				err = checkEpoch(ids, sizes, tc.n, seed, tc.wantEpoch, b)
			}
			if err != nil {
				t.Errorf("late consumer: %v", err)
			}
			late.Close()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}

// TestProducer_DropsConsumerThatNeverAcks: a consumer that heartbeats but
// never reads holds the producer up for MaxWait, is dropped, and the other
// goes on; the dropped one is told so, then joins again.
func TestProducer_DropsConsumerThatNeverAcks(t *testing.T) {
	const b, n, seed = 10, 100, 1
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Window: -1, Seed: seed, MaxWait: 300 * time.Millisecond})
	idle := f.dial(t, b, false)
	busy := f.dial(t, b, false)
	for range 2 {
		e := busy.Epoch()
		ids, sizes, err := consumerEpoch(context.Background(), busy)
		if err == nil {
			err = checkEpoch(ids, sizes, n, seed, e, b)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := f.p.Stats(); st.DroppedSlow != 1 || st.Consumers != 1 {
		t.Errorf("stats %+v: want 1 consumer dropped for holding a slot, 1 left", st)
	}
	var got error
	for _, err := range idle.Batches(context.Background()) {
		got = err
		break
	}
	if !errors.Is(got, ErrDropped) || !errors.Is(got, rpc.ErrAborted) {
		t.Errorf("the dropped consumer's next batch: %v, want ErrDropped", got)
	}
	busy.Close()
	e := idle.Epoch()
	ids, sizes, err := consumerEpoch(context.Background(), idle)
	if err != nil {
		t.Fatalf("after joining again: %v", err)
	}
	if e2 := idle.Epoch() - 1; e2 < e {
		t.Errorf("joined again at epoch %d, before %d", e2, e)
	} else if err := checkEpoch(ids, sizes, n, seed, e2, b); err != nil {
		t.Error(err)
	}
}

// TestProducer_DropsSilentConsumer: a consumer that joins and then says
// nothing (its process frozen, say) is dropped after Heartbeat; the
// others never wait for it longer.
func TestProducer_DropsSilentConsumer(t *testing.T) {
	const b, n, seed = 10, 100, 1
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Seed: seed, Heartbeat: 200 * time.Millisecond})
	rc, err := rpc.Dial(context.Background(), f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rpc.Call[joinResponse](context.Background(), rc, MethodJoin, joinRequest{Name: "train", Batch: b}); err != nil {
		t.Fatal(err)
	}
	c := f.dial(t, b, false)
	for range 2 {
		e := c.Epoch()
		ids, sizes, err := consumerEpoch(context.Background(), c)
		if err == nil {
			err = checkEpoch(ids, sizes, n, seed, e, b)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := f.p.Stats(); st.Dropped != 1 {
		t.Errorf("stats %+v: want the silent consumer dropped", st)
	}
}

// TestConsumer_IdleBetweenEpochsStaysJoined: a consumer that pauses
// between epochs (an evaluation, say) for less than MaxWait stays joined
// and iterates the next epoch whole, also when the ring holds whole
// epochs, so that the producer publishes the next epoch and forgets the
// one the consumer finished, whose end it keeps heartbeating. It failed
// before the fix: that heartbeat was "no such batch" once the epoch was
// forgotten, the node dropped the consumer at once, and its next loop
// said "context canceled".
func TestConsumer_IdleBetweenEpochsStaysJoined(t *testing.T) {
	const n, seed = 16, 1
	f := newFixture(t, n, Config{Batch: 8, Slots: 2, Seed: seed, Heartbeat: 200 * time.Millisecond, MaxWait: time.Minute})
	c := f.dial(t, 4, false)
	for k := range 2 {
		e := c.Epoch()
		ids, sizes, err := consumerEpoch(context.Background(), c)
		if err == nil {
			err = checkEpoch(ids, sizes, n, seed, e, 4)
		}
		if err != nil {
			t.Fatalf("epoch %d: %v", e, err)
		}
		if k == 0 {
			time.Sleep(time.Second) // five heartbeat periods
			if st := f.p.Stats(); st.Dropped+st.DroppedSlow > 0 || st.Epoch <= e+1 {
				t.Fatalf("after a pause between epochs: stats %+v, want the consumer joined and epoch %d begun", st, e+2)
			}
		}
	}
}

// TestService_BadAckIsErrDropped: an ack of a batch the producer never
// had drops the consumer, and its stream ends with ErrDropped saying so.
// It failed before the fix: the node cut the stream, and the consumer read
// "context canceled", which matches no sentinel.
func TestService_BadAckIsErrDropped(t *testing.T) {
	f := newFixture(t, 64, Config{Batch: 8, Slots: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := rpc.Dial(ctx, f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	j, err := rpc.Call[joinResponse](ctx, rc, MethodJoin, joinRequest{Name: "train", Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	st, err := rpc.OpenStream[ackMessage, batchMessage](ctx, rc, MethodConsume, consumeRequest{
		Name: "train", Ring: j.Ring, Consumer: j.Consumer, Epoch: j.Epoch, Bytes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Send(ctx, ackMessage{Epoch: j.Epoch, Index: 1000}); err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = st.Recv(ctx)
	}
	if !errors.Is(err, ErrDropped) || !errors.Is(err, rpc.ErrAborted) || !strings.Contains(err.Error(), "no such batch") {
		t.Errorf("the stream after a bad ack: %v, want ErrDropped saying no such batch", err)
	}
	if st := f.p.Stats(); st.Dropped != 1 || st.Consumers != 0 {
		t.Errorf("stats %+v: want the consumer dropped", st)
	}
}

// TestConsumer_BreakGivesUpTheEpoch: a loop that breaks gives up the rest
// of its epoch; the next Batches iterates the next epoch whole. Nobody
// else takes part in the epoch given up, so the producer cuts it short.
func TestConsumer_BreakGivesUpTheEpoch(t *testing.T) {
	const b, n, seed = 10, 100, 2
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Seed: seed})
	c := f.dial(t, b, false)
	e := c.Epoch()
	k := 0
	for _, err := range c.Batches(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		if k++; k == 3 {
			break
		}
	}
	if c.Epoch() != e+1 {
		t.Fatalf("after a break in epoch %d, Epoch = %d", e, c.Epoch())
	}
	ids, sizes, err := consumerEpoch(context.Background(), c)
	if err == nil {
		err = checkEpoch(ids, sizes, n, seed, e+1, b)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := f.p.Stats(); st.DroppedSlow+st.Dropped != 0 || st.CutShort != 1 {
		t.Errorf("stats %+v: want nobody dropped, one epoch cut short", st)
	}
}

// TestConsumer_CancelBeforeItsEpochStaysJoined: a consumer that joined
// for the next epoch (the current one's window closed) and whose loop's
// ctx ends before that epoch begins gives the epoch up and stays joined:
// its next loop iterates the epoch after, whole. It failed before the
// fix: giving up sent a release of the epoch after the next, which the
// producer refused as no such batch, and the node dropped the consumer.
func TestConsumer_CancelBeforeItsEpochStaysJoined(t *testing.T) {
	const b, n, seed = 8, 64, 4
	f := newFixture(t, n, Config{Batch: b, Slots: 2, Window: -1, Seed: seed, MaxWait: time.Minute})
	first := f.dial(t, b, false) // joins epoch 0 and iterates nothing yet: the producer stays in epoch 0
	waitFor(t, "the producer to fill its ring", func() bool { return f.p.Stats().Published == 2 })
	late := f.dial(t, b, false)
	if e := late.Epoch(); e != 1 {
		t.Fatalf("the late consumer joined epoch %d, want 1", e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	for _, err := range late.Batches(ctx) {
		if err == nil {
			t.Fatal("a batch of an epoch that has not begun")
		}
	}
	cancel()
	if e := late.Epoch(); e != 2 {
		t.Fatalf("after its loop gave epoch 1 up, Epoch = %d, want 2", e)
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if st := f.p.Stats(); st.Dropped+st.DroppedSlow > 0 {
			t.Fatalf("the late consumer was dropped for cancelling its loop: stats %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The first consumer's epochs 0 and 1 (the late one takes no part in
	// 1), then epoch 2 for both.
	errs := make(chan error, 1)
	go func() {
		for range 3 {
			e := first.Epoch()
			ids, sizes, err := consumerEpoch(context.Background(), first)
			if err == nil {
				err = checkEpoch(ids, sizes, n, seed, e, b)
			}
			if err != nil {
				errs <- fmt.Errorf("the first consumer's epoch %d: %w", e, err)
				return
			}
		}
		errs <- nil
	}()
	ids, sizes, err := consumerEpoch(context.Background(), late)
	if err == nil {
		err = checkEpoch(ids, sizes, n, seed, 2, b)
	}
	if err != nil {
		t.Fatalf("the late consumer's epoch 2: %v", err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestProducer_ResumesAtTheNextEpoch: a producer made again for a folder,
// with the same dataset and seed, begins after the last epoch the one
// before began; with another seed, at epoch 0.
func TestProducer_ResumesAtTheNextEpoch(t *testing.T) {
	const b, n, seed = 10, 30, 8
	f := newFixture(t, n, Config{Batch: b, Seed: seed})
	c := f.dial(t, b, false)
	for range 2 {
		if _, _, err := consumerEpoch(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	f.srv.Close()
	if err := f.p.Close(); err != nil {
		t.Fatal(err)
	}
	last := f.p.Stats().Epoch // the producer ran ahead of the consumer, a ring's worth
	for _, tc := range []struct {
		seed uint64
		want int64
	}{{seed, last + 1}, {seed + 1, 0}} {
		p, err := NewProducer(Config{Dataset: f.dataset, Dir: f.p.cfg.Dir, Batch: b, Seed: tc.seed})
		if err != nil {
			t.Fatal(err)
		}
		f.p = p
		f.serve(t)
		c := f.dial(t, b, false)
		if c.Epoch() != tc.want {
			t.Errorf("seed %d: the restarted producer serves epoch %d first, want %d", tc.seed, c.Epoch(), tc.want)
		}
		ids, sizes, err := consumerEpoch(context.Background(), c)
		if err == nil {
			err = checkEpoch(ids, sizes, n, tc.seed, tc.want, b)
		}
		if err != nil {
			t.Error(err)
		}
		c.Close()
		f.srv.Close()
		p.Close()
	}
	f.serve(t) // for the fixture's cleanup
}

// failing is a transform that fails from its nth batch on.
type failing struct {
	n, calls int
}

func (f *failing) Schema(in tensordict.RowSchema) (tensordict.RowSchema, error) { return in, nil }

func (f *failing) Apply(dst, src *tensordict.TensorDict, _ *Rows) error {
	if f.calls++; f.calls > f.n {
		return errors.New("the disk of the images is gone")
	}
	return gatherFrom(dst, src)
}

// TestProducer_TransformFails: a transform's error stops the producer;
// its consumers get ErrFailed naming the cause, and so do joiners.
func TestProducer_TransformFails(t *testing.T) {
	f := newFixture(t, 100, Config{Batch: 10, Slots: 2, Seed: 1, Transform: &failing{n: 3}})
	c := f.dial(t, 10, false)
	var got error
	for _, err := range c.Batches(context.Background()) {
		if err != nil {
			got = err
			break
		}
	}
	if !errors.Is(got, ErrFailed) || !strings.Contains(got.Error(), "the disk of the images is gone") {
		t.Fatalf("%v, want ErrFailed with the transform's error", got)
	}
	if st := f.p.Stats(); !strings.Contains(st.Failed, "the disk of the images is gone") {
		t.Errorf("Stats.Failed = %q", st.Failed)
	}
	if _, err := Dial(context.Background(), f.addr, "train", Options{Batch: 10, Root: f.root}); !errors.Is(err, ErrFailed) {
		t.Errorf("joining a failed producer: %v, want ErrFailed", err)
	}
}
