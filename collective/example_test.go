package collective_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/memmap"
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

// A training loop's gradient buffer from Alloc, reduced in place each step:
// on a shared-mapping communicator the ranks read each other's buffers
// where they are, without copies through the communicator's files (on
// the other transports Alloc is an ordinary tensor and the call the same).
func ExampleComm_Alloc() {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const size = 2
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
			grad, err := c.Alloc(memmap.Float32, 1<<16)
			if err != nil {
				fmt.Println(err)
				return
			}
			defer c.Free(grad)
			b, _ := grad.Bytes() // the buffer itself
			for step := range 3 {
				// The step's gradient, written into the buffer.
				for i := 0; i < len(b); i += 4 {
					binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(rank+step)))
				}
				if err := c.AllreduceInto(ctx, grad, grad, collective.Sum); err != nil {
					fmt.Println(err)
					return
				}
			}
			v, _ := tensordict.Values[float32](grad)
			sums[rank] = v[:2]
		})
	}
	wg.Wait()
	fmt.Println(sums)
	// Output: [[5 5] [5 5]]
}
