package serve_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/tensordict"
)

// double is a model whose output row is its input row times a factor, its
// one parameter.
type double struct{ factor float32 }

func (d *double) Forward(_ context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	x, err := in.Tensor("x")
	if err != nil {
		return nil, err
	}
	xs, err := tensordict.Values[float32](x)
	if err != nil {
		return nil, err
	}
	ys := make([]float32, len(xs))
	for i, v := range xs {
		ys[i] = v * d.factor
	}
	y, err := tensordict.FromSlice(ys, x.Shape()...)
	if err != nil {
		return nil, err
	}
	out, _ := tensordict.New(in.BatchSize()...)
	return out, out.Set("y", y)
}

func (d *double) Load(_ context.Context, params *tensordict.TensorDict) error {
	f, err := params.Tensor("factor")
	if err != nil {
		return err
	}
	v, err := tensordict.Values[float32](f)
	if err != nil || len(v) != 1 {
		return fmt.Errorf("factor: %v", err)
	}
	d.factor = v[0]
	return nil
}

var (
	rowIn  = tensordict.RowSchema{{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{2}}}
	rowOut = tensordict.RowSchema{{Key: []string{"y"}, DType: memmap.Float32, Shape: []int{2}}}
)

func rows(vals ...float32) *tensordict.TensorDict {
	x, _ := tensordict.FromSlice(vals, len(vals)/2, 2)
	td, _ := tensordict.New(len(vals) / 2)
	td.Set("x", x)
	return td
}

// A manager with two replicas of a model, a prediction, and new weights.
func ExampleManager() {
	m, err := serve.New(serve.Config{
		Input: rowIn, Output: rowOut, MaxBatch: 16, Replicas: 2,
		New: func(int) (serve.Model, error) { return &double{factor: 2}, nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()

	out, version, err := m.Predict(ctx, rows(1, 2, 3, 4)) // two rows
	if err != nil {
		log.Fatal(err)
	}
	y, _ := out.Tensor("y")
	ys, _ := tensordict.Values[float32](y)
	fmt.Println(ys, "version", version)

	factor, _ := tensordict.FromSlice([]float32{10}, 1)
	params, _ := tensordict.New()
	params.Set("factor", factor)
	if version, err = m.Load(ctx, params); err != nil { // every replica, between batches
		log.Fatal(err)
	}
	out, version, _ = m.Predict(ctx, rows(1, 2))
	y, _ = out.Tensor("y")
	ys, _ = tensordict.Values[float32](y)
	fmt.Println(ys, "version", version)
	// Output:
	// [2 4 6 8] version 0
	// [10 20] version 1
}

// A manager served by a node, and a client in another process (here, the
// same one) that shares the node's root: its rows stay in its slots, which
// the node maps, and a request carries none of them.
func ExampleDial() {
	root, _ := os.MkdirTemp("", "serve-example-")
	defer os.RemoveAll(root)
	m, err := serve.New(serve.Config{
		Input: rowIn, Output: rowOut, MaxBatch: 16,
		New: func(int) (serve.Model, error) { return &double{factor: 3}, nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	srv, _ := rpc.NewServer(rpc.WithRoot(root))
	svc, _ := serve.Register(srv)
	defer svc.Close() // after the server (deferred calls run last first)
	defer srv.Close()
	svc.Add("policy", m)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)

	ctx := context.Background()
	c, err := serve.Dial(ctx, l.Addr().String(), "policy", serve.WithRoot(root))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("mode:", c.Mode())

	// In place, as torch_spread's predict_inplace: rows into the input
	// slots, the outputs in the same rows of the output slots.
	c.Input().SetSlice(0, rows(1, 1))
	if _, err := c.PredictInto(ctx, 0, 1); err != nil {
		log.Fatal(err)
	}
	y, _ := c.Output().Tensor("y")
	ys, _ := tensordict.Values[float32](y)
	fmt.Println(ys[:2])

	// Or as a future.
	call := c.Go(ctx, rows(5, 6))
	out, _, err := call.Wait()
	if err != nil {
		log.Fatal(err)
	}
	y, _ = out.Tensor("y")
	ys, _ = tensordict.Values[float32](y)
	fmt.Println(ys)
	// Output:
	// mode: ref
	// [3 3]
	// [15 18]
}
