package collective

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// helperHier is the "hier" role: it prints its topology, runs the checks
// of helperCheck (a 1 MiB Allreduce, an Allgather of uneven sizes), then
// a Bcast and a 2 MiB Allreduce of random float64 whose result's hash it
// prints, for the test to compare across ranks, and passes 1 KiB and 3
// MiB messages around the ring of ranks (to a host-mate through its inbox,
// to the other host over TCP), each checked.
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
	next, prev := (c.Rank()+1)%c.Size(), (c.Rank()+c.Size()-1)%c.Size()
	for i, n := range []int{1 << 10, 3 << 20} {
		out := make([]byte, n)
		for j := range out {
			out[j] = byte(c.Rank()*31 + j*7 + i)
		}
		x := must1(tensordict.FromBytes(memmap.Uint8, []int{n}, out))
		in := must1(tensordict.Zeros(memmap.Uint8, n))
		r := c.Isend(ctx, x, next, i)
		if err := c.Recv(ctx, in, prev, i); err != nil {
			helperFail(fmt.Errorf("recv %d bytes from rank %d: %w", n, prev, err))
		}
		if err := r.Wait(ctx); err != nil {
			helperFail(fmt.Errorf("send %d bytes to rank %d: %w", n, next, err))
		}
		for j, b := range must1(in.Bytes()) {
			if b != byte(prev*31+j*7+i) {
				helperFail(fmt.Errorf("the %d bytes from rank %d differ at %d", n, prev, j))
			}
		}
	}
	fmt.Println("HIER DONE")
}
