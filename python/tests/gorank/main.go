// Command gorank is a Go rank in a communicator with Python ranks
// (python/tests/test_collective.py, mode "mixed" of collective_worker.py):
// it makes the same calls as the Python ranks, in the same order, with
// package collective, checks its results and prints "ok".
//
//	gorank -addr HOST:PORT -rank R -size N [-transport shm|tcp]
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

func main() {
	addr := flag.String("addr", "", "rank 0's address")
	rank := flag.Int("rank", 0, "this rank")
	size := flag.Int("size", 0, "the number of ranks")
	transport := flag.String("transport", "", "shm or tcp")
	flag.Parse()
	if err := run(*addr, *rank, *size, collective.Transport(*transport)); err != nil {
		fmt.Fprintln(os.Stderr, "gorank:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func f64(vals ...float64) *tensordict.Tensor {
	b := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	t, _ := tensordict.FromBytes(memmap.Float64, []int{len(vals)}, b)
	return t
}

func floats(t *tensordict.Tensor) []float64 {
	b, _ := t.Bytes()
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func run(addr string, r, n int, tr collective.Transport) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := collective.Join(ctx, collective.Config{Rank: r, Size: n, Addr: addr, Transport: tr})
	if err != nil {
		return err
	}
	defer c.Close()
	x := float64(r + 1)
	sum, err := c.Allreduce(ctx, f64(x, x, x, x), collective.Sum)
	if err != nil {
		return err
	}
	if got := floats(sum); got[0] != float64(n*(n+1)/2) {
		return fmt.Errorf("allreduce: %v", got)
	}
	ib := make([]byte, 16)
	binary.LittleEndian.PutUint64(ib, uint64(r))
	binary.LittleEndian.PutUint64(ib[8:], uint64(r))
	it, _ := tensordict.FromBytes(memmap.Int64, []int{1, 2}, ib)
	if _, err := c.Allgather(ctx, it, 0); err != nil {
		return err
	}
	// The Python ranks' Allgather with autograd: forward, then its
	// backward, a ReduceScatter whose counts the sidecars take from an
	// Allgather of every rank's count (mpi4torch's numelem).
	v := float64(r)
	if _, err := c.Allgather(ctx, f64(v, v, v), 0); err != nil {
		return err
	}
	w := make([]float64, 3*n)
	for i := range w {
		w[i] = float64(i)
	}
	all, err := c.Allgather(ctx, f64Int(3), 0) // the counts
	if err != nil {
		return err
	}
	ab, _ := all.Bytes()
	counts := make([]int, n)
	for i := range counts {
		counts[i] = int(binary.LittleEndian.Uint64(ab[8*i:]))
	}
	gx, err := c.AllgatherAdjoint(ctx, f64(w...), 0, counts)
	if err != nil {
		return err
	}
	for i, g := range floats(gx) {
		if want := float64(n * (3*r + i)); g != want {
			return fmt.Errorf("allgather backward: %v", floats(gx))
		}
	}
	return nil
}

// f64Int is one int64, as the sidecars' count exchange sends it.
func f64Int(v int64) *tensordict.Tensor {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(v))
	t, _ := tensordict.FromBytes(memmap.Int64, []int{1}, b)
	return t
}
