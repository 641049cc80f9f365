package replay

// Tests with writers and buffer nodes in other processes, killed with
// SIGKILL. The other process is this test binary run again (proctest);
// TENSORWIRE_REPLAY_HELPER says what it is.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

const (
	envHelper = "TENSORWIRE_REPLAY_HELPER" // "node", "stuck-writer" or "holder"
	envAddr   = "TENSORWIRE_REPLAY_ADDR"   // node: where to listen; writer: the node
	envRoot   = "TENSORWIRE_REPLAY_ROOT"   // the shared root
)

// TestHelperProcess is not a test: it is the body of the helper processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	proctest.RunHelper(t, envHelper, map[string]func() error{
		"node":         helperNode,
		"stuck-writer": func() error { return helperStuckWriter(t) },
		"holder":       helperHolder,
	})
}

// helperNode opens the buffer at $ROOT/buf, or creates it (capacity 4096),
// serves it on $ADDR (any port if unset), prints "ADDR host:port" and
// serves until killed.
func helperNode() error {
	root := os.Getenv(envRoot)
	b, err := Open(filepath.Join(root, "buf"))
	if errors.Is(err, ErrNotFound) {
		b, err = Create(filepath.Join(root, "buf"), Config{Capacity: 4096, Schema: testSchema})
	}
	if err != nil {
		return err
	}
	return svctest.ServeHelper(root, os.Getenv(envAddr), Register, "buf", b)
}

// helperHolder opens the buffer at $ROOT/buf, or creates it, prints
// "OPEN" and holds it until killed.
func helperHolder() error {
	prefix := filepath.Join(os.Getenv(envRoot), "buf")
	b, err := Open(prefix)
	if errors.Is(err, ErrNotFound) {
		b, err = Create(prefix, Config{Capacity: 16, Schema: testSchema})
	}
	if err != nil {
		return err
	}
	fmt.Println("OPEN", b.Capacity())
	select {}
}

// stuckIDs are the transitions the stuck writer never commits.
const stuckFirstID = 200

// helperStuckWriter reserves 8 slots on the buffer at $ADDR, writes half
// of its rows into them, prints "WRITING" and the slots, and waits to be
// killed: a writer dying in the middle of an extend.
func helperStuckWriter(t *testing.T) error {
	ctx := context.Background()
	c, err := Dial(ctx, os.Getenv(envAddr), "buf", WithRoot(os.Getenv(envRoot)))
	if err != nil {
		return err
	}
	if !c.SharedFS() {
		return fmt.Errorf("the client does not share the node's filesystem")
	}
	td := transitions(t, seq(stuckFirstID, stuckFirstID+8)...)
	r, err := rpc.Call[reserveResponse](ctx, c.rc, MethodReserve,
		reserveRequest{Name: "buf", Schema: td.RowSchema(), N: 8})
	if err != nil {
		return err
	}
	v, err := c.viewOf(ctx, r.ID)
	if err != nil {
		return err
	}
	half, err := td.Slice(0, 4)
	if err != nil {
		return err
	}
	if err := v.storage.SetRows(r.Slots[:4], half); err != nil {
		return err
	}
	fmt.Println("WRITING", strings.Trim(fmt.Sprint(r.Slots), "[]"))
	select {}
}

// TestProcess_WriterKilledMidExtend kills a writer that has reserved slots
// and written half its rows: the other writer and the sampler go on, no
// row of the dead writer is ever sampled, and its reservation expires.
func TestProcess_WriterKilledMidExtend(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 64, Schema: testSchema, Lease: 300 * time.Millisecond})
	c := dialBuffer(t, n.addr, "buf", root, "ref")
	extend(t, c, seq(0, 8)...)

	stuck := proctest.Start(t, envHelper+"=stuck-writer", envAddr+"="+n.addr, envRoot+"="+root)
	slots := stuck.Expect(t, "WRITING")
	if st := stats(t, n.b); st.Pending != 8 {
		t.Fatalf("%d slots pending while the writer writes, want 8", st.Pending)
	}
	stuck.Kill()
	t.Logf("writer killed holding slots %s", slots)

	// Another writer and a sampler run through the lease and after it.
	ctx := ctxT(t)
	var wg sync.WaitGroup
	var sampled atomic.Int64
	errs := make(chan error, 2)
	stop := time.Now().Add(800 * time.Millisecond)
	wg.Go(func() {
		for id := 8; time.Now().Before(stop); id += 4 {
			if id >= stuckFirstID && id < stuckFirstID+8 {
				continue
			}
			if _, err := c.Extend(ctx, transitions(t, id, id+1, id+2, id+3)); err != nil {
				errs <- err
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Go(func() {
		dst, err := testSchema.Zeros(32)
		if err != nil {
			errs <- err
			return
		}
		for time.Now().Before(stop) {
			if _, err := c.SampleInto(ctx, dst); err != nil {
				errs <- err
				return
			}
			ids, err := checkRows(dst)
			if err != nil {
				errs <- err
				return
			}
			for _, id := range ids {
				if id >= stuckFirstID && id < stuckFirstID+8 {
					errs <- fmt.Errorf("sampled transition %d of the dead writer", id)
					return
				}
			}
			sampled.Add(int64(len(ids)))
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The lease's timer has fired by now, unless the machine is busy: poll.
	st := stats(t, n.b)
	for deadline := time.Now().Add(30 * time.Second); st.Expired == 0 && time.Now().Before(deadline); st = stats(t, n.b) {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("after the kill: %d rows sampled whole; stats %+v", sampled.Load(), st)
	if st.Expired != 1 || st.Pending != 0 {
		t.Fatalf("the dead writer's reservation: %d expired, %d slots pending; want 1 and 0", st.Expired, st.Pending)
	}
}

// TestProcess_NodeKilledAndRestarted kills the buffer node with SIGKILL
// while a writer and a sampler run, and starts it again on the same
// address from the same prefix: they carry on by themselves, and every
// transition whose Extend returned is in the buffer, whole, where Extend
// said.
func TestProcess_NodeKilledAndRestarted(t *testing.T) {
	for _, mode := range sampleModes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			env := []string{envHelper + "=node", envRoot + "=" + root}
			node, addr := proctest.StartServer(t, env...)
			w := dialBuffer(t, addr, "buf", root, strings.TrimSuffix(mode, "+prefetch"))
			s := dialBuffer(t, addr, "buf", root, mode)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var stop atomic.Bool
			acked := map[int]int{} // id -> slot
			var nacked atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			wg.Go(func() {
				for id := 0; !stop.Load() && id+4 <= 4096; id += 4 {
					idx, err := w.Extend(ctx, transitions(t, id, id+1, id+2, id+3))
					if err != nil {
						errs <- fmt.Errorf("extend %d: %w", id, err)
						return
					}
					for i, slot := range idx {
						acked[id+i] = slot
					}
					nacked.Add(4)
					time.Sleep(time.Millisecond) // spread 4096 transitions over the kill and the restart
				}
			})
			var samples atomic.Int64
			wg.Go(func() {
				dst, err := testSchema.Zeros(16)
				if err != nil {
					errs <- err
					return
				}
				for !stop.Load() {
					if _, err := s.SampleInto(ctx, dst); err != nil {
						errs <- fmt.Errorf("sample: %w", err)
						return
					}
					if _, err := checkRows(dst); err != nil {
						errs <- err
						return
					}
					samples.Add(1)
				}
			})
			// progressed waits (up to 30 s) until the writer has acknowledged
			// more than acked transitions and the sampler taken more than
			// sampled batches.
			progressed := func(what string, acked, sampled int64) {
				t.Helper()
				for deadline := time.Now().Add(30 * time.Second); nacked.Load() <= acked || samples.Load() <= sampled; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) || len(errs) > 0 {
						t.Errorf("%s: %d transitions acknowledged (from %d), %d samples (from %d) after 30 s",
							what, nacked.Load(), acked, samples.Load(), sampled)
						return
					}
				}
			}
			time.Sleep(300 * time.Millisecond)
			progressed("before the kill", 0, 0)
			node.Kill()
			before, ackedBefore := samples.Load(), nacked.Load()
			time.Sleep(200 * time.Millisecond)
			node, _ = proctest.StartServer(t, append(env, envAddr+"="+addr)...)
			progressed("after the restart", ackedBefore, before)
			stop.Store(true)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if samples.Load() == before || nacked.Load() == ackedBefore {
				t.Errorf("the writer (%d acknowledged at the kill, %d at the end) or the sampler (%d samples, %d) did not carry on after the restart",
					ackedBefore, nacked.Load(), before, samples.Load())
			}
			node.Kill()
			checkHolds(t, filepath.Join(root, "buf"), acked)
			t.Logf("%d transitions acknowledged (%d before the kill), all present after the restart; %d samples", len(acked), ackedBefore, samples.Load())
		})
	}
}

// checkHolds opens the buffer at prefix and checks that each acknowledged
// transition is committed at its slot and whole.
func checkHolds(t *testing.T, prefix string, acked map[int]int) {
	t.Helper()
	if len(acked) == 0 {
		t.Fatal("no extend was acknowledged")
	}
	b, err := Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	slots := make([]int, 0, len(acked))
	ids := make([]int, 0, len(acked))
	for id, s := range acked {
		ids, slots = append(ids, id), append(slots, s)
		if st := state(b.slots.word(s)); st != stateCommitted {
			t.Fatalf("transition %d: slot %d is in state %d, not committed", id, s, st)
		}
	}
	td, err := b.storage.Gather(slots)
	if err != nil {
		t.Fatal(err)
	}
	got, err := checkRows(td)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != ids[i] {
			t.Fatalf("slot %d holds transition %d, want %d", slots[i], got[i], ids[i])
		}
	}
	if b.Len() != len(acked) {
		t.Errorf("the buffer holds %d transitions, %d were acknowledged", b.Len(), len(acked))
	}
}

// TestProcess_BufferHeldByOneProcess: while a process holds a buffer,
// another process opening it is refused with ErrInUse naming the holder's
// pid and host; once the holder is killed with SIGKILL, the buffer opens,
// with no lock left behind to clean up.
func TestProcess_BufferHeldByOneProcess(t *testing.T) {
	root := t.TempDir()
	prefix := filepath.Join(root, "buf")
	holder := proctest.Start(t, envHelper+"=holder", envRoot+"="+root)
	holder.Expect(t, "OPEN")
	host, _ := os.Hostname()
	want := fmt.Sprintf("in use by pid %d", holder.Pid())

	// Another helper process, and this one.
	second := proctest.Start(t, envHelper+"=holder", envRoot+"="+root)
	if err := second.WaitFor(30 * time.Second); err == nil {
		t.Fatal("a second process holding the buffer exited with status 0")
	}
	if msg := second.Stderr(); !strings.Contains(msg, want) || !strings.Contains(msg, host) {
		t.Errorf("the second process said %q; want it to name %q on %s", msg, want, host)
	}
	if b, err := Open(prefix); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), want) {
		if err == nil {
			b.Close()
		}
		t.Fatalf("Open while another process holds the buffer: %v; want ErrInUse naming %q", err, want)
	}
	if _, err := Create(prefix, Config{Capacity: 16}); !errors.Is(err, ErrExists) && !errors.Is(err, ErrInUse) {
		t.Fatalf("Create while another process holds the buffer: %v; want ErrExists or ErrInUse", err)
	}

	holder.Kill()
	b, err := Open(prefix)
	if err != nil {
		t.Fatalf("Open after the holder was killed: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
