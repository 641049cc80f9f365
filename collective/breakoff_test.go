//go:build linux

package collective

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestOwnFaultFailsEveryRank: a data-phase error of a rank's own (on a
// TCP communicator, and through shared mappings) (here its output tensor is a mapping whose file was
// truncated, so writing the result faults) fails its call with that error
// (memmap.ErrFault), kills no process, and fails every other rank's call
// at once with ErrAborted naming it, not at their deadlines: the others
// wait for its messages and have nothing else to tell them (through the
// mappings, the others may complete the call if they needed nothing more
// of it). Then the communicator is broken on every rank: the next call
// fails at once everywhere. Over TCP for each of the
// Allreduce's algorithms: recursive doubling (small), direct, ring.
// (Before, the others waited for their deadlines over TCP, and the process
// died of SIGBUS when the fault was in a message's handler.)
func TestOwnFaultFailsEveryRank(t *testing.T) {
	cases := []struct {
		name  string
		tr    Transport
		elems int
		ring  bool
	}{
		{"tcp/doubling", TCP, 1 << 10, false},
		{"tcp/direct", TCP, 1 << 20, false},
		{"tcp/ring", TCP, 1 << 20, true},
		{"shm", SHM, 1 << 20, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ring {
				saved := directMax
				directMax = 1
				t.Cleanup(func() { directMax = saved })
			}
			const n, bad = 4, 1
			comms := group(t, n, tc.tr)
			path := filepath.Join(t.TempDir(), "out")
			mm, err := memmap.Create(path, memmap.Float32, tc.elems)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { mm.Close() })
			badOut, err := tensordict.View(mm, 0, tc.elems)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			// onAll's context ends after 60 s: a rank failing only then
			// says context.DeadlineExceeded.
			_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (struct{}, error) {
				x, _ := tensordict.Zeros(memmap.Float32, tc.elems)
				out := x
				if c.Rank() == bad {
					out = badOut
				}
				return struct{}{}, c.AllreduceInto(ctx, out, x, Sum)
			})
			for r, err := range errs {
				t.Logf("rank %d: %v", r, err)
				switch {
				case err == nil && (r == bad || tc.tr == TCP):
					// Over TCP every rank needs rank 1's messages; through
					// the mappings the others may have had all they
					// needed before rank 1 faulted writing its result.
					t.Errorf("rank %d: no error", r)
				case err == nil:
				case errors.Is(err, context.DeadlineExceeded):
					t.Errorf("rank %d waited for its deadline: %v", r, err)
				case r == bad && !errors.Is(err, memmap.ErrFault):
					t.Errorf("rank %d (faulted): %v, want memmap.ErrFault", r, err)
				case r != bad && (!errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 1 ")):
					t.Errorf("rank %d: %v, want ErrAborted naming rank 1", r, err)
				}
			}
			_, errs = onAll(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
				x, _ := tensordict.Zeros(memmap.Float32, 4)
				return c.Allreduce(ctx, x, Sum)
			})
			for r, err := range errs {
				t.Logf("rank %d, next call: %v", r, err)
				if !errors.Is(err, ErrBroken) && !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 1 ") && r != bad {
					t.Errorf("rank %d after the fault: %v, want ErrBroken or ErrAborted naming rank 1", r, err)
				}
			}
			if err := errs[bad]; !errors.Is(err, memmap.ErrFault) {
				t.Errorf("rank %d after the fault: %v, want its own cause (memmap.ErrFault)", bad, err)
			}
		})
	}
}

// TestTCP_MalformedMessageBreaksOff: a data message whose length is not
// the one the ranks agreed on is an error of the receiving rank's own: its
// handler answers the sender with ErrAborted naming the receiver, and the
// receiver breaks off at once (not when its collective comes to wait for
// that message), so another rank's next call fails with ErrAborted naming
// it instead of waiting for its deadline. The message is handed to the
// handler directly, as a sender that lost count would send it.
func TestTCP_MalformedMessageBreaksOff(t *testing.T) {
	comms := group(t, 3, TCP)
	c := comms[1]
	k := msgKey{src: 0, space: spaceData, seq: 0}
	buf := make([]byte, 100)
	wait := c.postBytes(0, k, len(buf), into(buf))
	short, _ := tensordict.FromBytes(memmap.Uint8, []int{60}, make([]byte, 60))
	td, _ := tensordict.New()
	if err := td.Set("b", short); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := c.box.handle(ctx, msgReq{Session: c.session, Src: 0, Space: spaceData, Seq: 0, Data: rpc.Ref(td)})
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 1 broke off collective 0") || !strings.Contains(err.Error(), "sent 60 bytes") {
		t.Errorf("the sender's answer: %v, want ErrAborted naming rank 1 and why", err)
	}
	// Its own wait sees the mismatch, or the breaking off it caused
	// (a collective's call then returns its own cause: engine.go).
	if err := wait(ctx); err == nil || !strings.Contains(err.Error(), "sent 60 bytes") {
		t.Errorf("rank 1's wait: %v, want the mismatch", err)
	}
	if err := c.err(); !errors.Is(err, ErrBroken) || !errors.Is(err, ErrMismatch) {
		t.Errorf("rank 1 afterwards: %v, want ErrBroken with its own cause", err)
	}
	// Rank 2 hears of it through its watch of rank 1.
	x, _ := tensordict.Zeros(memmap.Float32, 4)
	_, err = comms[2].Allreduce(ctx, x, Sum)
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 1 broke off") {
		t.Errorf("rank 2's next call: %v, want ErrAborted naming rank 1", err)
	}
}

// TestGaveUp_NamesTheFirstFailure: a rank that stops waiting for a message
// because another rank broke off answers the message's sender with that
// rank's failure, not its own name, before it has broken itself: the
// sender, which may not have heard from the rank that failed yet, then
// reports the right rank. (Under load, TestOwnFaultFailsEveryRank's ranks
// 0 and 3 reported "rank 0 gave up on the message" instead of rank 1's
// fault, 3 runs in 60 under the race detector and two busy loops.)
func TestGaveUp_NamesTheFirstFailure(t *testing.T) {
	comms := group(t, 3, TCP)
	c := comms[0]
	peer := errorf(ErrAborted, "rank 1 broke off collective 0: a fault")

	// A consumer waiting for its turn under the data phase's context,
	// which the first error cancelled (tcp_direct.go).
	ctx, cancel := context.WithCancelCause(context.Background())
	fe := &firstError{cancel: cancel}
	fe.set(peer)
	fe.set(errors.New("an error the cancellation caused"))
	for _, tc := range []struct {
		name string
		why  error
		want string
	}{
		{"another rank's failure", context.Cause(ctx), "rank 1 broke off collective 0"},
		{"a rank lost", errorf(ErrPeerLost, "rank 2 unreachable"), "rank 2 unreachable"},
		{"its own fault", ownErr(errors.New("a fault")), "rank 0 gave up on the message"},
		{"its own context", context.Canceled, "rank 0 gave up on the message"},
		{"nothing known", nil, "rank 0 gave up on the message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.gaveUp(tc.why); !errors.Is(err, ErrAborted) && !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("gaveUp: %v, want an error saying %q", err, tc.want)
			}
		})
	}

	// A handler that found its slot abandoned by a point-to-point receiver
	// answers at once; in a collective it waits for the receiver's cause.
	hctx, hcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer hcancel()
	if err := c.box.abandoned(hctx, msgReq{Src: 1, Space: spaceP2P}); !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 0 gave up") {
		t.Errorf("a point-to-point message: %v, want ErrAborted naming rank 0", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.box.abandoned(hctx, msgReq{Src: 2, Space: spaceData}) }()
	select {
	case err := <-done:
		t.Fatalf("a collective's message answered before the receiver broke: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.fail(peer)
	if err := <-done; !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 1 broke off collective 0") {
		t.Errorf("a collective's message: %v, want rank 1's break-off", err)
	}
}

// TestTCP_TruncatedInputFailsEveryRank: over TCP, a rank whose input is a
// mapping whose file was truncated fails its call with memmap.ErrFault,
// and every other rank at once with ErrAborted naming it, where the fault
// comes while a message of the input is sent from a goroutine of its own:
// the direct Allreduce's pieces (sendAll), the ring's, a Bcast's tree
// sends (sendBytes' pieces). Before, only the data phase's own goroutine
// ran under the fault guard: rpc copied the input into its connection's
// buffer in a send's goroutine, and the process died of SIGBUS. The ranks
// run in a child process, so that a crash fails this test and not the
// test binary.
func TestTCP_TruncatedInputFailsEveryRank(t *testing.T) {
	const env = "COLLECTIVE_TEST_TRUNCATED_INPUT_CHILD"
	if os.Getenv(env) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTCP_TruncatedInputFailsEveryRank$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), env+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestTCP_TruncatedInputFailsEveryRank") {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			t.Fatalf("the ranks' process: %v\n%s", err, strings.Join(lines[:min(len(lines), 30)], "\n"))
		}
		return
	}
	// 128 KiB of float32: above recursive doubling's 64 KiB, and every
	// message under rpc's 256 KiB for a side connection, so rpc copies it
	// into a stream's buffer (on a side connection the kernel would answer
	// EFAULT instead).
	const bad, elems = 1, 1 << 15
	cases := []struct {
		name string
		n    int
		ring bool
		run  func(ctx context.Context, c *Comm, in *tensordict.Tensor) error
	}{
		{"allreduce/direct", 2, false, func(ctx context.Context, c *Comm, in *tensordict.Tensor) error {
			out, _ := tensordict.Zeros(memmap.Float32, elems)
			return c.AllreduceInto(ctx, out, in, Sum)
		}},
		{"allreduce/ring", 3, true, func(ctx context.Context, c *Comm, in *tensordict.Tensor) error {
			out, _ := tensordict.Zeros(memmap.Float32, elems)
			return c.AllreduceInto(ctx, out, in, Sum)
		}},
		{"bcast", 3, false, func(ctx context.Context, c *Comm, in *tensordict.Tensor) error {
			_, err := c.Bcast(ctx, in, bad)
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ring {
				saved := directMax
				directMax = 1
				t.Cleanup(func() { directMax = saved })
			}
			comms := group(t, tc.n, TCP)
			path := filepath.Join(t.TempDir(), "in")
			mm, err := memmap.Create(path, memmap.Float32, elems)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { mm.Close() })
			badIn, err := tensordict.View(mm, 0, elems)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (struct{}, error) {
				ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				in, _ := tensordict.Zeros(memmap.Float32, elems)
				if c.Rank() == bad {
					in = badIn
				}
				return struct{}{}, tc.run(ctx, c, in)
			})
			for r, err := range errs {
				t.Logf("rank %d: %v", r, err)
				switch {
				case err == nil:
					t.Errorf("rank %d: no error", r)
				case errors.Is(err, context.DeadlineExceeded):
					t.Errorf("rank %d waited for its deadline: %v", r, err)
				case r == bad && !errors.Is(err, memmap.ErrFault):
					t.Errorf("rank %d (faulted): %v, want memmap.ErrFault", r, err)
				case r != bad && (!errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 1 ")):
					t.Errorf("rank %d: %v, want ErrAborted naming rank 1", r, err)
				}
			}
		})
	}
}
