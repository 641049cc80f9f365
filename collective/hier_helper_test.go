package collective

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/tensorwire/tensorwire/tensordict"
)

// helperHier is the "hier" role: it prints its topology, runs the checks
// of helperCheck (a 1 MiB Allreduce, an Allgather of uneven sizes), then
// a Bcast and a 2 MiB Allreduce of random float64 whose result's hash it
// prints, for the test to compare across ranks.
func helperHier(ctx context.Context, c *Comm) {
	top, _ := json.Marshal(c.Topology())
	fmt.Println("TOPOLOGY", string(top))
	helperCheck(ctx, c)
	b, _ := tensordict.FromSlice([]float64{float64(c.Rank()), 7})
	bb, err := c.Bcast(ctx, b, c.Size()-1)
	if err != nil {
		helperFail(err)
	}
	if v, _ := tensordict.Values[float64](bb); v[0] != float64(c.Size()-1) || v[1] != 7 {
		helperFail(fmt.Errorf("bcast: %v", v))
	}
	rng := rand.New(rand.NewPCG(uint64(c.Rank()), 1))
	v := make([]float64, 1<<18)
	want := 0.0
	for r := range c.Size() {
		rr := rand.New(rand.NewPCG(uint64(r), 1))
		want += rr.Float64()
	}
	for i := range v {
		v[i] = rng.Float64()
	}
	x, _ := tensordict.FromSlice(v)
	y, err := c.Allreduce(ctx, x, Sum)
	if err != nil {
		helperFail(err)
	}
	yv, _ := tensordict.Values[float64](y)
	if d := yv[0] - want; d > 1e-12 || d < -1e-12 {
		helperFail(fmt.Errorf("allreduce[0] = %v, want %v", yv[0], want))
	}
	fmt.Printf("HASH %x\n", sha256.Sum256(must1(y.Bytes())))
	fmt.Println("HIER DONE")
}
