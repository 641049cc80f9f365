package loader_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A producer serves a dataset of 10 images from a node; a consumer on the
// node's filesystem iterates two epochs of it in batches of 4, cut from
// the producer's batches of 3.
func Example() {
	root, _ := os.MkdirTemp("", "loader-example-")
	defer os.RemoveAll(root)
	data := filepath.Join(root, "data")
	td, err := tensordict.Create(data, []int{10},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{10, 1, 8, 8}},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{10}})
	if err != nil {
		log.Fatal(err)
	}
	td.Close()

	// The node: a producer with its ring under the server's root.
	p, err := loader.NewProducer(loader.Config{
		Dataset: data, Dir: filepath.Join(root, "train"), Batch: 3, Seed: 1,
		Transform: &loader.Augment{Pad: 2, Flip: true, Mean: 0.5, Std: 0.25}, IndexKey: "index",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	srv, _ := rpc.NewServer(rpc.WithRoot(root))
	defer srv.Close()
	svc, _ := loader.Register(srv)
	svc.Add("train", p)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)

	// A training job.
	ctx := context.Background()
	c, err := loader.Dial(ctx, l.Addr().String(), "train", loader.Options{Batch: 4, Root: root})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("batches an epoch:", c.Len(), "by reference:", c.SharedFS())
	for range 2 {
		epoch, seen := c.Epoch(), map[int64]bool{}
		for batch, err := range c.Batches(ctx) {
			if err != nil {
				log.Fatal(err)
			}
			idx, _ := batch.Tensor("index")
			rows, _ := tensordict.Values[int64](idx)
			for _, i := range rows {
				seen[i] = true
			}
			img, _ := batch.Tensor("images")
			fmt.Println(" ", img.DType(), img.Shape())
		}
		fmt.Printf("epoch %d: %d samples\n", epoch, len(seen))
	}
	// Output:
	// batches an epoch: 3 by reference: true
	//   torch.float32 [4 1 8 8]
	//   torch.float32 [4 1 8 8]
	//   torch.float32 [2 1 8 8]
	// epoch 0: 10 samples
	//   torch.float32 [4 1 8 8]
	//   torch.float32 [4 1 8 8]
	//   torch.float32 [2 1 8 8]
	// epoch 1: 10 samples
}

// A Local loader is the same dataset, order and transform in the training
// process itself: what every job runs when it does not share a producer.
func ExampleNewLocal() {
	root, _ := os.MkdirTemp("", "loader-example-")
	defer os.RemoveAll(root)
	data := filepath.Join(root, "data")
	td, _ := tensordict.Create(data, []int{5}, tensordict.Field{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{5, 2}})
	td.Close()
	l, err := loader.NewLocal(loader.Config{Dataset: data, Sequential: true, IndexKey: "i"}, loader.Options{Batch: 2, DropLast: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for batch, err := range l.Batches(context.Background()) {
		if err != nil {
			log.Fatal(err)
		}
		i, _ := batch.Tensor("i")
		rows, _ := tensordict.Values[int64](i)
		fmt.Println(rows)
	}
	// Output:
	// [0 1]
	// [2 3]
}

// A training job saves its consumer's State with each checkpoint of its
// model; the job restarted from a checkpoint resumes the epoch where that
// checkpoint left it: no sample of the epoch twice. (The epoch is resumed
// while its window is open, another rank keeping it going; a consumer
// that joins a later epoch iterates that one whole.) The State's JSON is
// the Python client's state_dict.
func ExampleConsumer_Resume() {
	ctx := context.Background()
	c, err := loader.Dial(ctx, "node0:7070", "train", loader.Options{Batch: 64, Rank: 1, WorldSize: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	const checkpoint = "checkpoint/loader.json"
	if b, err := os.ReadFile(checkpoint); err == nil {
		var st loader.State
		if err := json.Unmarshal(b, &st); err != nil {
			log.Fatal(err)
		}
		if err := c.Resume(st); err != nil { // another rank's State, say
			log.Fatal(err)
		}
	}
	for batch, err := range c.Batches(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		_ = batch // a training step
		b, _ := json.Marshal(c.State())
		if err := os.WriteFile(checkpoint, b, 0o644); err != nil { // with the model's checkpoint
			log.Fatal(err)
		}
	}
}
