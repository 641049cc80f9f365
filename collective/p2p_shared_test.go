package collective

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestP2P_SharedBuffer: a message whose tensor is a shared buffer (Alloc)
// goes as a reference to the buffer, read where it is (no copy through
// the arena), blocking and not, into a plain tensor and into a shared
// one; a heap tensor's message still goes through the arena.
func TestP2P_SharedBuffer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	comms := groupWith(t, 2, SHM, t.TempDir(), nil)
	const n = 300_000 // float32: 1.2 MB, two chunks
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		name         string
		shared, into bool // the sender's tensor, the receiver's
		wantShared   uint64
	}{
		{"shared to heap", true, false, 1},
		{"shared to shared", true, true, 1},
		{"heap to shared", false, true, 0},
	} {
		want := must1(randTensor(t, rng, memmap.Float32, n).Bytes())
		before := comms[1].p2pStat.shared.Load()
		got := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
			mk := func(shared bool) *tensordict.Tensor {
				if shared {
					x := must1(c.Alloc(memmap.Float32, n))
					t.Cleanup(func() { c.Free(x) })
					return x
				}
				return must1(tensordict.Zeros(memmap.Float32, n))
			}
			if c.Rank() == 0 {
				x := mk(tc.shared)
				copy(must1(x.Bytes()), want)
				r := c.Isend(ctx, x, 1, 4)
				return nil, r.Wait(ctx)
			}
			y := mk(tc.into)
			if err := c.Recv(ctx, y, 0, 4); err != nil {
				return nil, err
			}
			return bytes.Clone(must1(y.Bytes())), nil
		})
		if !bytes.Equal(got[1], want) {
			t.Errorf("%s: the receiver's tensor is not what was sent", tc.name)
		}
		if d := comms[1].p2pStat.shared.Load() - before; d != tc.wantShared {
			t.Errorf("%s: %d messages read from a shared buffer, want %d", tc.name, d, tc.wantShared)
		}
		if regions, _ := liveRegions(comms[0]); regions != 0 {
			t.Errorf("%s: rank 0 holds %d regions after its send", tc.name, regions)
		}
	}
}

// TestP2P_SharedBufferGivenUp: a sender whose call ends while the receiver
// is reading its shared buffer marks the message failed before it
// returns (its caller may then change the buffer): the receiver, which
// checks the mark after its copy, fails the receive rather than keep bytes
// that may be torn; the communicator goes on.
func TestP2P_SharedBufferGivenUp(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	comms := groupWith(t, 2, SHM, t.TempDir(), nil)
	const n = 100_000
	x := must1(comms[0].Alloc(memmap.Float32, n))
	defer comms[0].Free(x)
	sctx, cancel := context.WithCancel(context.Background())
	sent := make(chan error, 1)
	testSharedP2PRead = func() {
		// The receiver has copied the bytes: the sender gives up now and
		// its caller overwrites the buffer.
		cancel()
		err := <-sent
		sent <- err
		clear(must1(x.Bytes()))
	}
	defer func() { testSharedP2PRead = nil }()
	go func() { sent <- comms[0].Send(sctx, x, 1, 7) }()
	ctx, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	y := must1(tensordict.Zeros(memmap.Float32, n))
	err := comms[1].Recv(ctx, y, 0, 7)
	if err == nil {
		t.Fatal("the receive succeeded although the sender gave up during its copy")
	}
	if serr := <-sent; !errors.Is(serr, context.Canceled) {
		t.Errorf("the sender: %v, want its context's end", serr)
	}
	testSharedP2PRead = nil
	// Still usable, both ways, by reference to the buffer.
	all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, x, 1, 8)
		}
		return 0, c.Recv(ctx, y, 0, 8)
	})
	// The given-up message's region goes once its reader is done (settle
	// polls for that): soon, not at once.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		regions, _ := liveRegions(comms[0])
		if regions == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 0 still holds %d regions", regions)
		}
	}
}

// TestP2P_RecvEndedDuringCopyStillReceives: a Recv whose context ends
// while the message's handler copies into its tensor waits for the copy
// and then returns nil, as its sender is told: the tensor holds the
// message, and the next Recv with the tag takes the next message. Before,
// it returned its context's error although the bytes were in place and
// the sender saw success: the message was lost to the receiver's caller.
func TestP2P_RecvEndedDuringCopyStillReceives(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	comms := groupWith(t, 2, SHM, t.TempDir(), nil)
	const n = 100_000
	x := must1(comms[0].Alloc(memmap.Float32, n))
	defer comms[0].Free(x)
	xb := must1(x.Bytes())
	for i := range xb {
		xb[i] = byte(i)
	}
	want := bytes.Clone(xb)
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	testSharedP2PRead = func() {
		// The receiver's handler has copied the bytes; the receiver's
		// context ends now, before the handler returns.
		rcancel()
		time.Sleep(50 * time.Millisecond)
	}
	defer func() { testSharedP2PRead = nil }()
	sent := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sent <- comms[0].Send(ctx, x, 1, 7)
	}()
	y := must1(tensordict.Zeros(memmap.Float32, n))
	rerr := comms[1].Recv(rctx, y, 0, 7)
	if serr := <-sent; serr != nil || rerr != nil {
		t.Fatalf("sender: %v; receiver: %v; want both nil", serr, rerr)
	}
	if !bytes.Equal(must1(y.Bytes()), want) {
		t.Fatal("the receiver's tensor does not hold the message")
	}
	testSharedP2PRead = nil
	// The next message with the tag is the next Recv's.
	clear(xb)
	all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, x, 1, 7)
		}
		return 0, c.Recv(ctx, y, 0, 7)
	})
	if !bytes.Equal(must1(y.Bytes()), make([]byte, 4*n)) {
		t.Fatal("the next Recv did not take the next message")
	}
}
