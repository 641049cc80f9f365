package collective_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Three ranks (here goroutines; normally processes, each calling Join with
// its own Rank) sum a vector.
func Example() {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String() // a free port for rank 0
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const size = 3
	sums := make([][]float32, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			c, err := collective.Join(ctx, collective.Config{Rank: rank, Size: size, Addr: addr})
			if err != nil {
				fmt.Println(err)
				return
			}
			defer c.Close()
			x, _ := tensordict.FromSlice([]float32{float32(rank), 1})
			y, err := c.Allreduce(ctx, x, collective.Sum)
			if err != nil {
				fmt.Println(err)
				return
			}
			sums[rank], _ = tensordict.Values[float32](y)
		})
	}
	wg.Wait()
	fmt.Println(sums)
	// Output: [[3 3] [3 3] [3 3]]
}

// The gradient of a loss through an Allreduce: the adjoint of Allreduce(Sum)
// is Allreduce(Sum) of the gradient.
func ExampleTape() {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const size = 2
	grads := make([][]float64, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			c, err := collective.Join(ctx, collective.Config{Rank: rank, Size: size, Addr: addr})
			if err != nil {
				fmt.Println(err)
				return
			}
			defer c.Close()
			tp := collective.NewTape(c)
			x0, _ := tensordict.FromSlice([]float64{1, 2})
			x := tp.Leaf(x0)
			y, err := tp.Allreduce(ctx, x, collective.Sum)
			if err != nil {
				fmt.Println(err)
				return
			}
			// Each rank's loss is sum(y): its gradient in y is ones, and
			// in x the sum of every rank's ones.
			if err := tp.Backward(ctx, y, nil); err != nil {
				fmt.Println(err)
				return
			}
			grads[rank], _ = tensordict.Values[float64](x.Grad())
		})
	}
	wg.Wait()
	fmt.Println(grads)
	// Output: [[2 2] [2 2]]
}
