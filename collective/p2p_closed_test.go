package collective

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// TestP2P_RecvFromAClosedRankFails: a receive from a rank that closed its
// communicator cleanly, with nothing of the message sent, fails with
// ErrPeerLost on its own, whether it was posted before the close (Irecv)
// or after it (Recv), on every transport; the communicator stays whole for
// the others' messages. Before, both waited for good (a clean close
// failed only a collective in flight): a frozen Python rank's Recv.
func TestP2P_RecvFromAClosedRankFails(t *testing.T) {
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			comms := group(t, 3, tr)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			x, _ := tensordict.FromSlice(make([]float32, 4))
			// A message sent and received before the close is unaffected.
			y, _ := tensordict.FromSlice([]float32{1, 2, 3, 4})
			s := comms[0].Isend(ctx, y, 1, 5)
			if err := comms[1].Recv(ctx, x, 0, 5); err != nil {
				t.Fatal(err)
			}
			if err := s.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			before := comms[1].Irecv(ctx, x, 0, 7)
			if err := comms[0].Close(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := before.Wait(ctx); !errors.Is(err, ErrPeerLost) {
				t.Fatalf("Irecv posted before rank 0 closed: %v, want ErrPeerLost", err)
			}
			if err := comms[1].Recv(ctx, x, 0, 8); !errors.Is(err, ErrPeerLost) {
				t.Fatalf("Recv posted after rank 0 closed: %v, want ErrPeerLost", err)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("the receives took %v to fail", d)
			}
			// Ranks 1 and 2 still exchange messages.
			s = comms[2].Isend(ctx, y, 1, 9)
			if err := comms[1].Recv(ctx, x, 2, 9); err != nil {
				t.Fatalf("a message from rank 2 after rank 0 closed: %v", err)
			}
			if err := s.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
