package loader

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestService_RefusesRingReadsBelowCoherent: a consumer that does not
// share the node's page cache may not read batches from its own mapping of
// the ring (the producer rewrites it in place, and another cache would
// show it old rows); it is refused with FailedPrecondition, and the same
// peer's bytes stream works.
func TestService_RefusesRingReadsBelowCoherent(t *testing.T) {
	f := newFixture(t, 64, Config{Batch: 8, Slots: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := rpc.Dial(ctx, f.addr) // no root: Sharing None
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	j, err := rpc.Call[joinResponse](ctx, rc, MethodJoin, joinRequest{Name: "train", Batch: 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, bytes := range []bool{false, true} {
		st, err := rpc.OpenStream[ackMessage, batchMessage](ctx, rc, MethodConsume, consumeRequest{
			Name: "train", Ring: j.Ring, Consumer: j.Consumer, Epoch: j.Epoch, Bytes: bytes})
		if err == nil {
			_, err = st.Recv(ctx)
			st.Close()
		}
		if refused := errors.Is(err, rpc.ErrFailedPrecondition); refused != !bytes {
			t.Fatalf("bytes %v: %v", bytes, err)
		}
	}
}
