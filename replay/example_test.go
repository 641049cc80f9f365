package replay_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// batch returns n transitions: an observation of 4 floats and a reward.
func batch(n int, first float32) *tensordict.TensorDict {
	obs := make([]float32, 4*n)
	rew := make([]float32, n)
	for i := range rew {
		rew[i] = first + float32(i)
	}
	td, _ := tensordict.New(n)
	o, _ := tensordict.FromSlice(obs, n, 4)
	r, _ := tensordict.FromSlice(rew, n)
	td.Set("obs", o)
	td.Set("reward", r)
	return td
}

// A buffer in one process: the first batch sets the schema, samples are
// prioritized, and the trainer feeds new priorities back.
func ExampleBuffer() {
	dir, _ := os.MkdirTemp("", "replay")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	b, err := replay.Create(filepath.Join(dir, "buf"), replay.Config{
		Capacity: 1000,
		Sampler:  replay.Prioritized(0.6, 0.4),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	idx, err := b.Extend(ctx, batch(3, 10))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("slots:", idx)

	td, info, err := b.Sample(ctx, 8)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sampled:", td.BatchSize(), len(info.Weights), "weights")

	prio := make([]float64, len(info.Indices))
	for i := range prio {
		prio[i] = 0.5 // |TD error|, say
	}
	n, err := b.UpdatePriority(ctx, info, prio)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("updated:", n)
	// Output:
	// slots: [0 1 2]
	// sampled: [8] 8 weights
	// updated: 8
}

// A buffer served by a node, and a client sharing its filesystem: rows go
// straight into and out of the shared storage, only slots cross the wire.
func ExampleDial() {
	root, _ := os.MkdirTemp("", "replay")
	defer os.RemoveAll(root)
	ctx := context.Background()

	// The buffer node.
	b, err := replay.Create(filepath.Join(root, "buf"), replay.Config{Capacity: 1000})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	srv, _ := rpc.NewServer(rpc.WithRoot(root))
	defer srv.Close()
	svc, _ := replay.Register(srv)
	svc.Add("buf", b)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)

	// A writer or trainer, anywhere that mounts root.
	c, err := replay.Dial(ctx, l.Addr().String(), "buf", replay.WithRoot(root))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("shared filesystem:", c.SharedFS())
	if _, err := c.Extend(ctx, batch(64, 0)); err != nil {
		log.Fatal(err)
	}
	td, _, err := c.Sample(ctx, 32)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sampled:", td.BatchSize())
	// Output:
	// shared filesystem: true
	// sampled: [32]
}
