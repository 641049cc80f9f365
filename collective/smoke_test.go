package collective

import (
	"context"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

func TestComm_Smoke(t *testing.T) {
	for _, tr := range transports() {
		for _, n := range []int{2, 3, 4} {
			t.Run(name(tr, n), func(t *testing.T) {
				comms := group(t, n, tr)
				res := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
					x, _ := tensordict.FromSlice([]float32{float32(c.Rank()), 1, 2})
					return c.Allreduce(ctx, x, Sum)
				})
				for r, x := range res {
					v, _ := tensordict.Values[float32](x)
					want := float32(n * (n - 1) / 2)
					if v[0] != want || v[1] != float32(n) || v[2] != float32(2*n) {
						t.Fatalf("rank %d: %v", r, v)
					}
				}
			})
		}
	}
}
