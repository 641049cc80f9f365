package store

import (
	"context"
	"slices"
	"testing"
	"time"
)

// A caller whose context ends while its Get is between the node's reply
// and the acknowledgement still gets the items: they were removed for it.
// Before, Get dropped them and the node held them for GetTimeout, so a
// drain that stopped at an empty bin lost them (faulttest's
// TestStoreAcrossHosts saw "2 acknowledged appends lost" under load).
func TestClient_GetCancelledAfterTakeLosesNothing(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveStore(t, root, "st", Options{InlineBytes: 512, GetTimeout: time.Hour})
			c := dialT(t, n.addr, "st", root, mode)
			for i, size := range []int{4, 2000, 8} {
				if _, err := c.Append(ctxT(t), "b", itemTD(t, int64(i), size)); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(ctxT(t))
			testAfterTake = cancel
			t.Cleanup(func() { testAfterTake = nil })
			got, err := c.Get(ctx, "b")
			testAfterTake = nil
			if err != nil {
				t.Fatalf("Get whose context ended after the node's reply: %v (its items are held for GetTimeout)", err)
			}
			if g := ids(t, got); !slices.Equal(g, []int64{0, 1, 2}) {
				t.Fatalf("Get = %v, want [0 1 2]", g)
			}
			if again, err := c.Get(ctxT(t), "b"); err != nil || len(again) != 0 {
				t.Fatalf("second Get: %d items, %v (an item drained twice)", len(again), err)
			}
		})
	}
}
